"""Engine: owns model, KV pool, scheduler and the requests; ``step()`` is the whole loop body.

Not thread-safe by design: one thread drives it (the offline API directly, the server through
``AsyncEngine``), so no lock sits on the hot path.
"""

from __future__ import annotations

import itertools
import logging
import time

import torch
from tqdm import tqdm

from anycore.cache.manager import KVCacheManager
from anycore.config import EngineConfig, parse_dtype
from anycore.engine.detokenizer import IncrementalDetokenizer
from anycore.engine.grammar import GrammarCompiler, GrammarMatcher
from anycore.engine.prompt_logprobs import merge_prompt_logprobs
from anycore.engine.runner import KVPool, ModelRunner
from anycore.engine.thread_governor import ThreadGovernor
from anycore.engine.weight_arena import consolidate_weights
from anycore.errors import InvalidRequest
from anycore.kernels.dispatch import select_ops
from anycore.layers.embedding import LogitsHead, VocabEmbedding
from anycore.layers.moe import StackedExperts
from anycore.layers.quant import (
    GGUF,
    NONE,
    linear_method_factory,
    quantize_online,
    release_free_heap,
    resolve_quantization,
)
from anycore.layers.quant.gguf_blocks import blocks_for
from anycore.layers.quant.smoothing import calibration_token_ids
from anycore.loader import open_model_source
from anycore.models import build_model
from anycore.outputs import EngineStats, StepOutput
from anycore.sampling_params import SamplingParams
from anycore.scheduler.request import Request, TokenLogprob
from anycore.scheduler.scheduler import ScheduledRequest, Scheduler, SchedulerOutput
from anycore.spec.draft_model import DraftModelSpeculator, load_draft_model
from anycore.spec.eagle import EagleSpeculator
from anycore.spec.mtp import mtp_checkpoint
from anycore.spec.policy import HEAD_ALGORITHMS, Speculator

log = logging.getLogger("anycore")


def streamed_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads: every parameter and buffer, except embedding
    tables that are only gathered from (a row per token), i.e. all but one the logits head
    multiplies by (tied, with no int8 copy or GGUF blocks of its own); blocks a tied head shares
    with its table count once. MoE experts count top_k of every layer's experts: what a batch-1
    decode token streams."""
    heads = [m for m in model.modules() if isinstance(m, LogitsHead)]
    head_tensors = {id(t) for h in heads for t in (*h.parameters(recurse=False), *h.buffers(recurse=False))}
    gathered = {id(t) for m in model.modules() if isinstance(m, VocabEmbedding)
                and not any(h.tied_to is m and h.multiplies_table for h in heads)
                for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))} - head_tensors
    experts = [m for m in model.modules() if isinstance(m, StackedExperts)]
    expert_tensors = {id(t) for m in experts for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))}
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]
               if id(t) not in gathered and id(t) not in expert_tensors}
    active = sum(t.numel() * t.element_size() * m.top_k // m.num_experts
                 for m in experts for t in (*m.parameters(recurse=False), *m.buffers(recurse=False)))
    return sum(t.numel() * t.element_size() for t in tensors.values()) + active


def _table_and_head_in_blocks(model: torch.nn.Module, source) -> None:
    """``--quantization gguf``: the embedding table and the logits head keep the file's blocks
    too when their type has a kernel (as llama.cpp runs them); a tied pair shares one tensor."""
    table, head = getattr(model, "embed_tokens", None), getattr(model, "lm_head", None)
    if not isinstance(table, VocabEmbedding) or not isinstance(head, LogitsHead):
        return
    table_blocks = source.matrix_blocks("model.embed_tokens.weight")
    if head.tied_to is table and table_blocks is not None:  # one tensor for both, in the head kernel's layout
        table_blocks = blocks_for(head.kernels, table_blocks)
    head_blocks = table_blocks if head.tied_to is table else source.matrix_blocks("lm_head.weight")
    if head_blocks is not None and head.tied_to is not table:
        head_blocks = blocks_for(head.kernels, head_blocks)
    if head_blocks is not None:
        head.use_gguf_blocks(head_blocks)  # (first: a tied head checks its shape on the float table)
    if table_blocks is not None:
        table.use_gguf_blocks(table_blocks)


def gguf_summary(model: torch.nn.Module, native_stack: bool) -> str:
    """What ``--quantization gguf`` runs: projections per block type (or dense), and where."""
    from collections import Counter

    from anycore.layers.linear import Linear
    from anycore.layers.quant.gguf_blocks import format_name

    kinds = Counter(format_name(m.qtype) if m.method.name == GGUF else "dense (no block kernel for its type)"
                    for m in model.modules() if isinstance(m, Linear))
    impls = {m.kernels.choices.get("gguf_linear") for m in model.modules()
             if isinstance(m, Linear) and m.method.name == GGUF and getattr(m, "kernels", None) is not None}
    kernel = f"gguf_linear on {', '.join(sorted(i for i in impls if i))}; " if impls else ""
    where = "in the native decoder stack" if native_stack else "op by op"
    heads = [m for m in model.modules() if isinstance(m, LogitsHead)]
    head = (f"logits head {format_name(heads[0].gguf_qtype)}" if heads and heads[0].gguf_qtype is not None
            else "logits head dense")
    tables = [m for m in model.modules() if isinstance(m, VocabEmbedding)]
    table = (f"embedding {format_name(tables[0].gguf_qtype)}" if tables and tables[0].gguf_qtype is not None
             else "embedding dense")
    return (f"projections {', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}; {kernel}{where}; "
            f"{head}, {table}")


# the window pool's share of the full pool's token count (see kv_window_split)
WINDOW_POOL_RATIO = 0.5


def kv_window_split(budget: int, num_layers: int, num_window_layers: int, kv_heads: int, head_dim: int,
                    dtype: torch.dtype, min_window_slots: int) -> tuple[int, int]:
    """(full-pool tokens, window-pool tokens) that fit ``budget`` bytes.

    Without sliding layers: one pool, every layer's KV per token. With them, the global layers'
    pool gets N tokens and the sliding layers' window pool WINDOW_POOL_RATIO x N, but at least
    ``min_window_slots`` (the longest sequence plus one step's tokens, so scoring a whole
    sequence at once, or a model all of whose requests are short, never waits on the window
    pool), never more than N. A long request holds ``window - 1`` + one step's positions there,
    so that pool is sized for many requests, not for their lengths."""
    if num_window_layers == 0:
        return budget // KVPool.bytes_per_slot(num_layers, kv_heads, head_dim, dtype), 0
    full = KVPool.bytes_per_slot(num_layers - num_window_layers, kv_heads, head_dim, dtype)
    win = KVPool.bytes_per_slot(num_window_layers, kv_heads, head_dim, dtype)
    n = int(budget // (full + WINDOW_POOL_RATIO * win))
    w = int(WINDOW_POOL_RATIO * n)
    if w < min_window_slots:  # (the floor takes more: the full pool gives it back)
        w = min_window_slots
        n = (budget - w * win) // full if full else n
        if n < w:  # (a budget too small for that: both pools as many tokens as one pool held)
            n = w = budget // (full + win)
    return n, w


def kv_layout(num_layers: int, window_layers: tuple[int, ...], window: int, num_slots: int,
              num_window_slots: int) -> str:
    """One line: which layers keep which KV (start-up log, /v1/engine, doctor)."""
    if not window_layers:
        return f"{num_layers} layers keep every position's KV: one pool of {num_slots} tokens"
    full = num_layers - len(window_layers)
    return (f"{full} global layers keep every position's KV ({num_slots} tokens); {len(window_layers)} "
            f"sliding-window layers keep only their last {window} positions' (a window pool of "
            f"{num_window_slots} tokens, freed as the window moves)")


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        t0 = time.perf_counter()
        self.config = config
        if config.threads:
            torch.set_num_threads(config.threads)
        self.dtype = parse_dtype(config.dtype)
        # the source (for GGUF: the parsed file, ~75 MB of metadata objects for SmolLM2) is only
        # needed while loading; the engine keeps its small config dict (for `anycore quantize`)
        source = open_model_source(config.model)
        self.hf_config = source.hf_config
        self.model_config = mc = source.config
        self.tokenizer = source.tokenizer
        self.model_name = source.path.name

        kv_gb = config.resolved_kv_cache_gb()
        # sliding-window layers keep only their window's KV, in a pool of their own (TP=1; no
        # sharded model has them): see kv_window_split
        window_layers = (tuple(i for i, w in enumerate(mc.layer_sliding_windows) if w)
                         if config.tensor_parallel_size == 1 else ())
        window = max((mc.layer_sliding_windows[i] for i in window_layers), default=0)
        max_len = config.max_model_len or mc.max_position_embeddings
        num_slots, num_window_slots = kv_window_split(
            int(kv_gb * (1 << 30)), mc.num_layers, len(window_layers), mc.num_kv_heads, mc.head_dim, self.dtype,
            min(max_len, mc.max_position_embeddings) + config.max_num_batched_tokens)
        if num_slots < 16:
            raise ValueError(f"KV budget {kv_gb} GiB holds only {num_slots} tokens; raise --kv-cache-gb")
        if max_len > num_slots:
            log.warning("max_model_len %d exceeds the KV pool (%d tokens); capping it", max_len, num_slots)
            max_len = num_slots
        self.max_model_len = max_len

        self.parallel = self._start_parallel(config, mc, num_slots, max_len)
        threads = torch.get_num_threads() if self.parallel is not None else config.threads  # (the rank's share)
        self.ops = select_ops(overrides=config.kernels, threads=threads)
        # (not under TP: every rank must keep the thread count its placement gave it)
        self.thread_governor = (ThreadGovernor(torch.get_num_threads())
                                if config.adaptive_threads and self.parallel is None else None)
        # TP shards dense weights only, so the automatic choice never picks a GGUF file's blocks there
        requested = NONE if self.parallel is not None and config.quantization is None else config.quantization
        self.quantization, prequantized = resolve_quantization(requested, source.hf_config, source.format,
                                                               self.dtype, source.has_blocks)
        weights = tqdm(source.weights(self.dtype, native_blocks=self.quantization == GGUF),
                       total=len(source.weight_names), desc="loading weights", unit="tensor", disable=None, leave=False)
        if (config.quantize_lm_head or config.quantize_embedding) and prequantized:
            raise ValueError("quantize_lm_head / quantize_embedding apply to online quantization; this checkpoint "
                             "is pre-quantized")
        # pre-quantized checkpoints load int8 weights directly; online quantization loads the
        # float weights, calibrates, smooths and quantizes once the runner exists (below)
        self.model = build_model(mc, self.ops, self.dtype, weights, max_len,
                                 linear_method_factory(self.quantization, True) if prequantized else None)
        if self.quantization == GGUF:
            _table_and_head_in_blocks(self.model, source)
        kv_heads = mc.num_kv_heads
        if self.parallel is not None:  # this rank's shard; its KV pool holds only its KV heads
            from anycore.layers.parallel import shard_llama_family

            kv_heads = shard_llama_family(self.model, self.parallel.group)
        self.kv_pool = KVPool(mc.num_layers, num_slots, kv_heads, mc.head_dim, self.dtype, window_layers,
                              num_window_slots)
        self.kv = KVCacheManager(num_slots, config.enable_prefix_caching, window or None, num_window_slots)
        self.kv_layout = kv_layout(mc.num_layers, window_layers, window, num_slots, num_window_slots)
        spec = config.speculative_config()
        self.speculator: Speculator | None = None
        if spec is not None and spec.algorithm == "draft":
            draft = load_draft_model(config.model, mc, self.ops, self.dtype, max_len, spec.draft_model,
                                     spec.draft_layers)
            self.speculator = DraftModelSpeculator(spec, draft, self.ops, num_slots, self.dtype)
        elif spec is not None and spec.algorithm in HEAD_ALGORITHMS:
            if not hasattr(self.model, "_run_layers"):
                raise ValueError(f"{mc.architecture} cannot expose the hidden states {spec.algorithm} drafts from")
            head = mtp_checkpoint(self.model, source, self.dtype) if spec.algorithm == "mtp" else None
            self.speculator = EagleSpeculator(spec, self.model, self.ops, num_slots, self.dtype, max_len, head)
            del head
        elif spec is not None:
            self.speculator = Speculator(spec)
        self.scheduler = Scheduler(self.kv, config.max_num_batched_tokens, config.max_num_seqs, config.policy,
                                   self.speculator)
        self.runner = ModelRunner(self._runner_model(), self.kv_pool, self.ops,
                                  self.kv.swa.window_of if self.kv.swa is not None else None)
        self.runner.native_single_step = config.burst != 0
        if self.parallel is not None:  # (no native stack nor native greedy decode: no collectives in them)
            self.runner.native.enabled = False
        if isinstance(self.speculator, EagleSpeculator):
            self.runner.capture_layers = self.speculator.capture_layers
        del weights, source  # drops the parsed model file (and its mapped pages) before calibrating
        release_free_heap()
        if self.quantization and not prequantized:
            calib = calibration_token_ids(self.tokenizer, mc.vocab_size)
            window = min(512, self.max_model_len)
            quantize_online(
                self.model, linear_method_factory(self.quantization),
                lambda: [self.score(calib[i : i + window]) for i in tqdm(
                    range(0, len(calib) - 1, window), desc="calibrating", unit="window", disable=None, leave=False)],
                lm_head=config.quantize_lm_head, embedding=config.quantize_embedding,
            )
            self.kv_pool.discard()  # the calibration windows' K/V: no request holds a slot yet
        consolidate_weights(self.model)  # one huge-page block: faster to stream, no heap left fragmented
        tensors = [*self.model.parameters(), *self.model.buffers()]
        # (GGUF blocks are bytes: their layers count as out x in weights)
        self.num_params = sum(t.numel() for t in tensors) + sum(
            m.out_features * m.in_features - m.qweight.numel() for m in self.model.modules()
            if getattr(m, "qweight", None) is not None and m.qweight.dtype == torch.uint8)
        self.weight_bytes = streamed_weight_bytes(self.model)  # read per decode step (the bandwidth limit's divisor)

        eos = set(mc.eos_token_ids)
        if getattr(self.tokenizer, "eos_token_id", None) is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos)
        # structured output's compiler for this vocabulary (xgrammar loads on first use); the
        # server compiles on its worker threads through it, the engine thread only makes matchers
        self.grammar = GrammarCompiler(self.tokenizer, mc.vocab_size, sorted(eos))
        self._requests: dict[str, Request] = {}  # unfinished requests; each carries its detokenizer
        self._ids = itertools.count()
        self.kv_cache_gb = kv_gb
        log.info(
            "model %s (%s, %d layers, %.1fM params) dtype %s, quantization %s; KV pool %.2f GiB = %d tokens; max_model_len %d; "
            "loaded in %.1fs",
            self.model_name, mc.architecture, mc.num_layers,
            self.num_params / 1e6, config.dtype, self.quantization or "none", kv_gb, num_slots, max_len,
            time.perf_counter() - t0,
        )
        log.info("KV layout: %s", self.kv_layout)
        log.info("kernels: %s", ", ".join(f"{k}={v}" for k, v in self.ops.choices.items()))
        if mc.moe is not None:
            log.info("Mixture of Experts: %d of %d layers sparse, %d experts, top-%d; each sparse layer's experts "
                     "one fused_moe call",
                     len(mc.moe.moe_layers), mc.num_layers, mc.moe.num_experts, mc.moe.top_k)
        log.info("decoder layers: %s", self.runner.native.layers_path())
        if self.parallel is not None:
            self.parallel.wait_ready()
            log.info("tensor parallel: %d ranks ready (%s)", config.tensor_parallel_size, self.parallel.describe())
        if self.quantization == GGUF:
            log.info("gguf: %s", gguf_summary(self.model, self.runner.native.stack(self.dtype) is not None))

    # ---- tensor parallel (anycore/distributed/) -------------------------------------------------
    @staticmethod
    def _start_parallel(config: EngineConfig, mc, num_slots: int, max_len: int):
        """Rank 0's group (workers started, rendezvous done, sizes sent), or None for TP=1."""
        if config.tensor_parallel_size == 1:
            return None
        if config.node_rank != 0:
            raise ValueError("node_rank > 0 runs worker ranks only (anycore.distributed.node), not an Engine")
        from anycore.distributed.driver import TensorParallel
        from anycore.layers.parallel import check_tensor_parallel

        check_tensor_parallel(mc, config.tensor_parallel_size)  # (before any rank starts)
        parallel = TensorParallel(config)
        parallel.init_workers(num_slots, max_len)
        return parallel

    def _runner_model(self):
        if self.parallel is None:
            return self.model
        from anycore.distributed.driver import DriverModel

        return DriverModel(self.model, self.parallel.group)

    def close(self) -> None:
        """Stops the tensor-parallel workers (a no-op for TP=1); the engine cannot step after."""
        if self.parallel is not None:
            self.parallel.close()

    # ---- requests -------------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None,
                    index: int = 0) -> str:
        """Queues one sample (``params.n == 1``) of a prompt already validated by the
        InputProcessor (prompt in the vocabulary and shorter than ``max_model_len``); ``index``
        is echoed in its outputs. Returns the request id."""
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._requests:  # would orphan the live request of that id
            raise InvalidRequest(f"duplicate request id {rid!r}")
        req = Request(rid, list(prompt_token_ids), params, self.eos_token_ids, self.max_model_len, index=index)
        req.detokenizer = IncrementalDetokenizer(
            self.tokenizer, req.prompt_token_ids, params.stop, params.skip_special_tokens,  # type: ignore[arg-type]
            params.include_stop_str_in_output,
        )
        if params.seed is not None:
            req.generator = torch.Generator().manual_seed(params.seed)
        if params.structured_output is not None:  # (the server compiled it already: a no-op then)
            compiled = self.grammar.compile(params.structured_output)
            req.grammar = GrammarMatcher(compiled, self.grammar.vocab_size, self.grammar.stop_token_ids)
        self.scheduler.add(req)
        self._requests[rid] = req
        return rid

    def abort(self, request_id: str) -> None:
        """Ends an unfinished request and frees its KV; an unknown or finished id is a no-op."""
        req = self._requests.pop(request_id, None)
        if req is not None:
            self.scheduler.finish(req, "abort")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def request_ids(self) -> list[str]:
        """The unfinished requests' ids, oldest first."""
        return list(self._requests)

    def stats(self) -> EngineStats:
        kv, radix = self.kv, self.kv.radix
        return EngineStats(
            num_waiting=len(self.scheduler.waiting),
            num_running=len(self.scheduler.running),
            kv_slots_total=kv.num_slots,
            kv_slots_used=kv.num_used,
            kv_slots_cached=radix.evictable_size if radix is not None else 0,
            kv_window_slots_total=kv.swa.num_slots if kv.swa is not None else 0,
            kv_window_slots_used=kv.swa.num_used if kv.swa is not None else 0,
            prefix_queried_tokens=radix.queried_tokens if radix is not None else 0,
            prefix_hit_tokens=radix.hit_tokens if radix is not None else 0,
            num_preemptions=self.scheduler.num_preemptions,
            **self._spec_stats(),
        )

    def _spec_stats(self) -> dict[str, int]:
        if self.speculator is None:
            return {}
        t = self.speculator.totals
        return {"spec_verify_steps": t.num_verify_steps, "spec_draft_tokens": t.num_draft_tokens,
                "spec_accepted_tokens": t.num_accepted_tokens}

    # ---- the loop body ----------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        """schedule -> execute -> update, for every step kind alike (prefill chunks and decodes
        mixed, or one multi-step greedy decode)."""
        eagle = self.speculator if isinstance(self.speculator, EagleSpeculator) else None
        t_step = time.perf_counter()  # (drafting happens while scheduling: part of a step's cost)
        # (EAGLE needs the target's features of every position: no native multi-step decode)
        out = self.scheduler.schedule(0 if eagle else self.runner.max_steps(self.config.burst))
        if out.is_empty:
            return []
        gov = self.thread_governor
        if gov is not None and torch.get_num_threads() != gov.threads:
            torch.set_num_threads(gov.threads)  # (another engine in this process changed it)
        t0 = time.perf_counter()
        sampled, logprobs, prompt_lps = self.runner.execute(out)
        if eagle is not None:
            eagle.add_features(out, self.runner.features)
            self.runner.features = None
        for rid, piece in prompt_lps.items():
            req = self._requests.get(rid)
            if req is not None:
                merge_prompt_logprobs(req, piece)
        if gov is not None and out.all_decode:
            steps = max(len(t) for t in sampled.values()) if sampled else 1
            gov.observe(len(out.scheduled), (time.perf_counter() - t0) / steps)
        progressed = self.scheduler.update(out, sampled)
        if self.speculator is not None and out.decode_shaped:
            # (a multi-step native decode: its time per step; a verify step is one step)
            steps = max(1, *(len(t) for t in sampled.values())) if out.all_decode else 1
            self.speculator.record_step(out.num_batched_tokens, (time.perf_counter() - t_step) / steps)
        results = []
        for req, tokens in progressed:
            lps = logprobs.get(req.request_id, [])
            req.logprobs += lps
            results.append(self._output(req, tokens, lps))
        return results

    def _output(self, req: Request, tokens: list[int], logprobs: list[TokenLogprob]) -> StepOutput:
        """What a step gave ``req`` (its new tokens, already detokenized); a finished request's
        engine state goes with it."""
        finished = req.is_finished
        prompt_lps = None
        if req.params.prompt_logprobs is not None and not req.prompt_logprobs_sent and not req.needs_prompt_logprobs:
            prompt_lps = req.prompt_logprobs  # (complete now: with the first output after the prompt)
            req.prompt_logprobs_sent = True
        out = StepOutput(
            request_id=req.request_id,
            new_token_ids=tokens,
            delta_text=req.detokenizer.delta(final=finished),
            finished=finished,
            finish_reason=req.finish_reason,
            new_logprobs=logprobs,
            prompt_logprobs=prompt_lps,
            num_prompt_tokens=req.num_prompt_tokens,
            num_output_tokens=req.num_output_tokens,
            num_cached_tokens=req.num_cached_tokens,
            index=req.index,
        )
        if finished:
            del self._requests[req.request_id]
        return out

    # ---- scoring --------------------------------------------------------------------------------
    def score(self, token_ids: list[int]) -> torch.Tensor:
        """log p(token[i+1] | tokens[:i+1]) for every i: ``[len - 1]`` fp32."""
        if len(token_ids) < 2:
            raise ValueError(f"score() takes 2..{self.max_model_len} tokens, got {len(token_ids)}")
        logprobs = self.next_token_logprobs(token_ids)[:-1]
        targets = torch.tensor(token_ids[1:])
        return logprobs.gather(1, targets[:, None])[:, 0]

    @torch.inference_mode()
    def next_token_logprobs(self, token_ids: list[int]) -> torch.Tensor:
        """log p(· | tokens[:i+1]) over the vocabulary for every i: ``[len, vocab]`` fp32.

        Runs outside the scheduler (the caller must not be stepping concurrently); the sequence
        is prefilled in budget-sized chunks through the same runner and KV pool as serving.
        """
        if not 1 <= len(token_ids) <= self.max_model_len:
            raise ValueError(f"next_token_logprobs() takes 1..{self.max_model_len} tokens, got {len(token_ids)}")
        req = Request("score", list(token_ids), SamplingParams(max_tokens=1))
        slots = self.kv.allocate(len(token_ids))
        if slots is None:
            raise ValueError("not enough free KV slots to score this sequence")
        req.slots = slots
        chunk = self.scheduler.max_num_batched_tokens
        pieces = []
        try:
            for start in range(0, len(token_ids), chunk):
                n = min(chunk, len(token_ids) - start)
                out = SchedulerOutput([ScheduledRequest(req, start, n, True)])
                pieces.append(self.runner.prompt_logits(out).log_softmax(dim=-1))
        finally:
            self.kv.free(slots)
        return torch.cat(pieces)
