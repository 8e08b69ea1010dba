"""`anycore bench speculative`: batch-1 decode with and without speculative decoding.

For each method in ``--methods`` (ngram, draft, eagle, eagle3, mtp) one engine is built with that
algorithm and the other engine flags. Every repeat runs every workload (spec_workloads.py: three
input-grounded tasks and open chat) twice in a row on that engine: once as a plain request
(``SamplingParams.speculative=False``, so the engine and its caches are the same) and once
speculating. Greedy, ``--output-len`` tokens with ``ignore_eos``. Decode speed counts the tokens
after the first over the time after the first (prefill is not timed). Reported per workload:
plain and speculative tok/s (medians), the speed-up, the acceptance length (tokens a verify step
emitted) and rate from the engine's counters, and whether the tokens are identical (greedy
verification is lossless: anything else is a bug, and the command exits 1).

``--peers llama-server``: llama.cpp's server on the same GGUF file (or ``--server-gguf-type``),
one slot, plain and with its own speculative decoding (``--llama-spec-args``, by default its
prompt lookup ``--spec-type ngram-simple``), the same prompt token ids, greedy; its figures are
the server's own timings (``predicted_per_second``, ``draft_n``, ``draft_n_accepted``).

``--cost``: the price of verification alone, one engine step of a plain decode vs a verify of
1 + k tokens per request with every draft rejected, at batch sizes ``--cost-batches``: where the
ratio climbs well above 1, verification stops being free (``--speculative-max-batch``).

CPU timings on a shared machine are noisy: runs are interleaved, medians are quoted, and the
load average and CPU model are printed with them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from anycore.bench import checks, hardware
from anycore.bench.checks import BenchArgumentError
from anycore.bench.report import write_json_atomic
from anycore.bench.spec_workloads import INPUT_GROUNDED, SPEC_WORKLOADS
from anycore.config import EngineConfig
from anycore.sampling_params import SamplingParams

METHODS = ("ngram", "draft", "eagle", "eagle3", "mtp")
PEERS = ("llama-server",)
LLAMA_SPEC_ARGS = "--spec-type ngram-simple"


def add_speculative_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculative benchmark")
    g.add_argument("--methods", default="ngram",
                   help=f"comma-separated, of {','.join(METHODS)} (draft: with --speculative-model or "
                        "--speculative-draft-layers; eagle/eagle3: with --speculative-model)")
    g.add_argument("--workloads", default=",".join(SPEC_WORKLOADS),
                   help=f"comma-separated, of {','.join(SPEC_WORKLOADS)} (default all)")
    g.add_argument("--output-len", type=int, default=128, help="greedy tokens per request (ignore_eos)")
    g.add_argument("--repeats", type=int, default=3, help="interleaved runs of each cell; medians are quoted")
    g.add_argument("--peers", default="none", help="none, or llama-server (built on demand, cached)")
    g.add_argument("--server-gguf-type", default=None,
                   help="GGUF type llama-server runs (default: the model file as it is, e.g. Q4_1; F16 to "
                        "compare with anycore bf16)")
    g.add_argument("--llama-spec-args", default=LLAMA_SPEC_ARGS,
                   help=f"llama-server's speculative flags (default {LLAMA_SPEC_ARGS!r}: its prompt lookup)")
    g.add_argument("--cache-dir", default=str(Path.home() / ".cache/anycore/peers"),
                   help="GGUF copies and the llama-server build")
    g.add_argument("--no-build", action="store_true", help="never build llama-server; skip it when not cached")
    g.add_argument("--llama-cmake-args", default="", help="extra CMake args for the llama-server build")
    g.add_argument("--cost", action="store_true", help="also measure the verify cost by batch size")
    g.add_argument("--cost-batches", default="1,2,4,8,16", help="batch sizes of --cost")
    g.add_argument("--cost-steps", type=int, default=8, help="steps timed per batch size (the fastest is kept)")
    g.add_argument("--json", default=None, help="also write the results here (a folder: speculative.json in it)")


@dataclass(frozen=True)
class SpecInputs:
    methods: list[str]
    workloads: list[str]
    peers: list[str]
    cost_batches: list[int]
    json: Path | None
    cache_dir: Path


def check_speculative(args: argparse.Namespace, config: EngineConfig) -> SpecInputs:
    methods = checks.names(args.methods, METHODS, "--methods")
    workloads = checks.names(args.workloads, tuple(SPEC_WORKLOADS), "--workloads")
    peers = checks.names(args.peers, PEERS, "--peers", allow_none=True, required=False)
    checks.at_least(args.output_len, 2, "--output-len")  # (decode speed is timed after the first token)
    checks.at_least(args.repeats, 1, "--repeats")
    checks.at_least(args.cost_steps, 1, "--cost-steps")
    checks.threads(config.threads)
    if "draft" in methods and not (config.speculative_model or config.speculative_draft_layers):
        raise BenchArgumentError("--methods draft needs --speculative-model or --speculative-draft-layers")
    if any(m.startswith("eagle") for m in methods) and not config.speculative_model:
        raise BenchArgumentError("--methods eagle/eagle3 needs --speculative-model (the head's folder)")
    if len([m for m in methods if m in ("draft", "eagle", "eagle3")]) > 1:
        raise BenchArgumentError("--methods: at most one of draft, eagle, eagle3 (they share --speculative-model)")
    if peers:
        checks.gguf_file(config.model)  # llama-server reads the same file
    json_path = checks.output_file(args.json, "speculative.json", "--json") if args.json else None
    cache_dir = checks.creatable_dir(Path(args.cache_dir).expanduser(), "--cache-dir")
    cost_batches = checks.positive_ints(args.cost_batches, "--cost-batches")
    return SpecInputs(methods, workloads, peers, cost_batches, json_path, cache_dir)


# ---- anycore --------------------------------------------------------------------------------

@dataclass
class Cell:
    """One (engine, workload): per-repeat figures; ``tokens`` of the last run of each mode."""

    plain: list[float] = field(default_factory=list)  # decode tok/s
    spec: list[float] = field(default_factory=list)
    accept_len: list[float] = field(default_factory=list)  # tokens per verify step
    accept_rate: list[float] = field(default_factory=list)  # accepted / drafted
    identical: bool = True
    tokens: dict[str, list[int]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        p, s = statistics.median(self.plain), statistics.median(self.spec)
        return {"plain_tok_s": p, "spec_tok_s": s, "speedup": s / p if p else None,
                "acceptance_length": statistics.median(self.accept_len) if self.accept_len else None,
                "acceptance_rate": statistics.median(self.accept_rate) if self.accept_rate else None,
                "identical": self.identical, "plain_runs": self.plain, "spec_runs": self.spec}


def decode_once(engine, prompt: list[int], params: SamplingParams) -> tuple[list[int], float]:
    """The request's tokens and its decode tok/s (tokens after the first / time after the first)."""
    engine.add_request(prompt, params)
    tokens: list[int] = []
    first_at = first_count = None
    while engine.has_unfinished():
        for o in engine.step():
            tokens += o.new_token_ids
            if first_at is None and tokens:
                first_at, first_count = time.perf_counter(), len(tokens)
    elapsed = time.perf_counter() - first_at
    return tokens, (len(tokens) - first_count) / elapsed if elapsed > 0 else 0.0


def chat_prompts(tokenizer, workloads: list[str]) -> dict[str, list[int]]:
    return {w: tokenizer.apply_chat_template([{"role": "user", "content": SPEC_WORKLOADS[w]}],
                                             add_generation_prompt=True) for w in workloads}


def run_method(config: EngineConfig, method: str, workloads: list[str], output_len: int, repeats: int,
               log=print) -> tuple[dict[str, Cell], dict[str, Any], dict[str, list[int]]]:
    """The cells of one method's engine, what it ran, and the prompts' token ids."""
    from anycore.engine.engine import Engine

    # no prefix cache: every run prefills its prompt the same way, so plain and speculative runs
    # start from bit-identical KV (a cached prompt's last tokens are computed in a different-shaped
    # extend, and in bf16 that alone can flip a near-tie later on)
    engine = Engine(replace(config, speculative_algorithm=method, enable_prefix_caching=False))
    prompts = chat_prompts(engine.tokenizer, workloads)
    about = {"kernels": dict(engine.ops.choices), "dtype": str(engine.dtype),
             "num_speculative_tokens": config.num_speculative_tokens}
    base = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    modes = {"plain": replace(base, speculative=False), "spec": base}
    for params in modes.values():  # warm-up, full length (kernels, KV pages, the thread governor)
        decode_once(engine, prompts[next(iter(prompts))], params)
    cells = {w: Cell() for w in prompts}
    for r in range(repeats):
        for w, ids in prompts.items():
            cell = cells[w]
            for mode, params in modes.items():
                before = engine.stats()
                tokens, rate = decode_once(engine, ids, params)
                after = engine.stats()
                getattr(cell, mode).append(rate)
                if mode == "spec":
                    steps = after.spec_verify_steps - before.spec_verify_steps
                    drafted = after.spec_draft_tokens - before.spec_draft_tokens
                    accepted = after.spec_accepted_tokens - before.spec_accepted_tokens
                    cell.accept_len.append(1 + accepted / steps if steps else 1.0)
                    cell.accept_rate.append(accepted / drafted if drafted else 0.0)
                cell.tokens[mode] = tokens
            cell.identical &= cell.tokens["plain"] == cell.tokens["spec"]
            log(f"  [{method} {r + 1}/{repeats}] {w}: plain {cell.plain[-1]:.1f}  spec {cell.spec[-1]:.1f} tok/s"
                f"  accept len {cell.accept_len[-1]:.2f}")
    return cells, about, prompts


# ---- llama-server ---------------------------------------------------------------------------

def _llama_servers(inputs: SpecInputs, args: argparse.Namespace, gguf: Path, threads: int, log) -> list:
    from anycore.bench.peers import llama_server_build, servers
    from anycore.bench.peers.gguf_files import gguf_variant

    exe = llama_server_build.ensure_llama_server(inputs.cache_dir, build=not args.no_build, log=log,
                                                 extra_args=args.llama_cmake_args)
    if args.server_gguf_type:
        gguf = gguf_variant(gguf, args.server_gguf_type, inputs.cache_dir / "gguf")
    logs = (inputs.json.parent if inputs.json else inputs.cache_dir) / "logs"
    out = []
    for name, extra in (("plain", []), ("spec", args.llama_spec_args.split())):
        port = servers.free_port()
        cmd = [str(exe), "-m", str(gguf), "-t", str(threads), "-tb", str(threads), "-np", "1", "-c", "4096",
               "--host", "127.0.0.1", "--port", str(port), *extra]
        out.append(servers.Server(f"llama-server {name}", cmd, port, logs / f"llama-server-spec-{name}.log"))
    return out


def llama_decode_once(url: str, prompt: list[int], output_len: int) -> tuple[list[int], float, int, int]:
    """Greedy tokens, decode tok/s, drafted and accepted tokens, from llama-server's own timings."""
    import httpx

    body = {"prompt": prompt, "n_predict": output_len, "temperature": 0.0, "ignore_eos": True,
            "cache_prompt": True, "return_tokens": True, "stream": False}
    r = httpx.post(f"{url}/completion", json=body, timeout=600)
    r.raise_for_status()
    out = r.json()
    t = out["timings"]
    return out.get("tokens", []), float(t["predicted_per_second"]), int(t.get("draft_n", 0)), \
        int(t.get("draft_n_accepted", 0))


def run_llama(servers_: list, prompts: dict[str, list[int]], output_len: int, repeats: int,
              log=print) -> dict[str, Cell]:
    plain, spec = servers_
    cells = {w: Cell() for w in prompts}
    llama_decode_once(plain.url, prompts[next(iter(prompts))], 8)  # warm-up
    llama_decode_once(spec.url, prompts[next(iter(prompts))], 8)
    for r in range(repeats):
        for w, ids in prompts.items():
            cell = cells[w]
            tokens, rate, _, _ = llama_decode_once(plain.url, ids, output_len)
            cell.plain.append(rate)
            cell.tokens["plain"] = tokens
            tokens, rate, drafted, accepted = llama_decode_once(spec.url, ids, output_len)
            cell.spec.append(rate)
            cell.tokens["spec"] = tokens
            cell.accept_rate.append(accepted / drafted if drafted else 0.0)
            cell.identical &= cell.tokens["plain"] == cell.tokens["spec"]
            log(f"  [llama-server {r + 1}/{repeats}] {w}: plain {cell.plain[-1]:.1f}  spec {rate:.1f} tok/s"
                f"  accepted {accepted}/{drafted}")
    return cells


# ---- verification cost by batch size --------------------------------------------------------

def verify_cost(config: EngineConfig, batches: list[int], steps: int, log=print) -> list[dict[str, float]]:
    """Fastest step time of a plain decode vs a verify of 1 + k tokens per request (every draft
    rejected: a draft of copies of the last token), per batch size."""
    from anycore.engine.engine import Engine
    from anycore.spec.policy import SpecState, SpeculativeConfig, Speculator

    k = config.num_speculative_tokens

    class AlwaysDraft(Speculator):
        def propose(self, req, limit: int, batch_size: int) -> list[int]:
            req.spec_state = req.spec_state or SpecState()
            return [req.all_token_ids[-1]] * min(k, limit)

    engine = Engine(replace(config, speculative_algorithm="ngram"))
    drafter = AlwaysDraft(SpeculativeConfig(num_tokens=k, max_batch=max(batches)))

    def step_ms(batch: int, speculator) -> float:
        engine.scheduler.speculator = None
        for i in range(batch):
            engine.add_request(engine.tokenizer.encode(f"Write a story number {i}:"),
                               SamplingParams(temperature=0, max_tokens=(k + 1) * steps + 8, ignore_eos=True))
        done = 0
        while done < batch:  # prefill, and every request's first token
            done += sum(1 for o in engine.step() if o.new_token_ids)
        engine.scheduler.speculator = speculator
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t0)
        for rid in engine.request_ids():
            engine.abort(rid)
        engine.scheduler.speculator = None
        return min(times) * 1e3

    rows = []
    step_ms(1, None)  # warm-up
    for b in batches:
        plain, verify = step_ms(b, None), step_ms(b, drafter)
        rows.append({"batch": b, "plain_ms": plain, "verify_ms": verify, "ratio": verify / plain})
        log(f"  batch {b:3d}: plain {plain:7.2f} ms  verify 1+{k} {verify:7.2f} ms  ratio {verify / plain:.2f}")
    return rows


# ---- the command ----------------------------------------------------------------------------

def _print_table(title: str, cells: dict[str, Cell]) -> None:
    print(f"\n{title}")
    print(" workload  plain_tok/s  spec_tok/s  speedup  accept_len  accept_rate  identical")
    for w, c in cells.items():
        s = c.summary()
        alen = f"{s['acceptance_length']:10.2f}" if s["acceptance_length"] is not None else f"{'-':>10s}"
        print(f" {w:8s} {s['plain_tok_s']:12.1f} {s['spec_tok_s']:11.1f} {s['speedup']:8.2f} {alen} "
              f"{s['acceptance_rate']:12.2f}  {s['identical']}")


def run_speculative(args: argparse.Namespace, config: EngineConfig) -> int:
    inputs = check_speculative(args, config)
    from anycore.bench.compare.context import versions

    result: dict[str, Any] = {
        "meta": {"cpu_model": hardware.cpu_model(), "cpus": os.cpu_count(), "threads": config.threads,
                 "model": str(config.model), "output_len": args.output_len, "repeats": args.repeats,
                 "load_average_start": os.getloadavg()[0], "versions": versions(),
                 "started": time.strftime("%Y-%m-%d %H:%M:%S")},
        "anycore": {}, "llama_server": None, "cost": None,
    }
    print(f"CPU {result['meta']['cpu_model']}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")

    def save() -> None:
        if inputs.json is not None:
            write_json_atomic(result, inputs.json)

    ok = True
    prompts: dict[str, list[int]] = {}
    for method in inputs.methods:
        print(f"anycore, --speculative-algorithm {method}, k={config.num_speculative_tokens}:")
        cells, about, prompts = run_method(config, method, inputs.workloads, args.output_len, args.repeats)
        result["anycore"][method] = {"engine": about, "workloads": {w: c.summary() for w, c in cells.items()}}
        ok &= all(c.identical for c in cells.values())
        _print_table(f"anycore {method} (medians of {args.repeats}, batch 1, greedy, {args.output_len} tokens):",
                     cells)
        save()
    if inputs.peers:
        from anycore.bench.peers.base import PeerUnavailable

        try:
            servers_ = _llama_servers(inputs, args, Path(config.model or checks.model_source(None)),
                                      config.threads or os.cpu_count() or 1, print)
        except PeerUnavailable as e:
            print(f"llama-server skipped: {e}")
            result["llama_server"] = {"skipped": str(e)}
            servers_ = []
        try:
            for s in servers_:
                s.start()
            if servers_:
                print(f"llama-server, {args.llama_spec_args}:")
                cells = run_llama(servers_, prompts, args.output_len, args.repeats)
                result["llama_server"] = {"cmd": [" ".join(s.cmd) for s in servers_],
                                          "workloads": {w: c.summary() for w, c in cells.items()}}
                _print_table(f"llama-server ({args.llama_spec_args}; acceptance length not reported by it):", cells)
        except PeerUnavailable as e:
            print(f"llama-server skipped: {e}")
            result["llama_server"] = {"skipped": str(e)}
        finally:
            for s in servers_:
                s.stop()
        save()
    if args.cost:
        print(f"verify cost by batch size (fastest of {args.cost_steps} steps):")
        result["cost"] = verify_cost(config, inputs.cost_batches, args.cost_steps)
        save()
    grounded = [w for w in inputs.workloads if w in INPUT_GROUNDED]
    for method, r in result["anycore"].items():
        wl = r["workloads"]
        if grounded:
            best = statistics.median(wl[w]["speedup"] for w in grounded)
            print(f"{method}: median speed-up on input-grounded tasks {best:.2f}x", end="")
        if "chat" in wl:
            print(f"; open chat {wl['chat']['speedup']:.2f}x", end="")
        print()
    result["meta"]["load_average_end"] = os.getloadavg()[0]
    print(f"load average {os.getloadavg()[0]:.2f}")
    save()
    if not ok:
        print("ERROR: speculative output differs from plain greedy output")
        return 1
    return 0
