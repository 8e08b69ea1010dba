"""Micro-benchmark: the W8A8 linear at decode (M = 1) over a whole model's worth of weights.

    python -m anycore.bench.int8_gemv [--impls amx,avx512_vnni] [--layers 30] [--rows 1] [--json]

Default shapes are SmolLM2-135M's per layer (qkv [960x576], o [576x576], gate_up [3072x576],
down [576x1536]), one separately packed weight per layer, called layer after layer as a decode
step does, so the weights stream from memory as they do in the engine (30 layers of int8 are
~106 MB). Reports, per implementation, the step time and the packed-weight GB/s it implies,
and what the fixed per-call part costs (activation quantization, epilogue, dispatch), measured
as the same calls on 16-column weights whose streaming is negligible. The bf16 ``linear`` GEMV
on the same shapes is the yardstick (2x the bytes). Not a test: numbers vary by host and load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from anycore.kernels.dispatch import implementations, make_op

SMOLLM2_135M = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}


def _median_time(fn, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _layers(kernel, shapes: dict[str, tuple[int, int]], layers: int, gen: torch.Generator):
    out = []
    for _ in range(layers):
        for n, k in shapes.values():
            q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
            out.append((kernel.pack(q), torch.rand(n, generator=gen) * 1e-2 + 1e-3, k, n))
    return out


def bench_int8_gemv(impls: list[str] | None = None, shapes: dict[str, tuple[int, int]] | None = None,
                    layers: int = 30, rows: int = 1, repeats: int = 15, seed: int = 0) -> dict[str, dict]:
    shapes = shapes or SMOLLM2_135M
    usable = [i for i, why in implementations("w8a8_linear") if not why]
    impls = [i for i in (impls or usable) if i in usable]
    gen = torch.Generator().manual_seed(seed)
    xs = {k: torch.randn(rows, k, generator=gen).to(torch.bfloat16) for _, k in shapes.values()}
    weight_bytes = layers * sum(n * k for n, k in shapes.values())
    res: dict[str, dict] = {}
    for impl in impls:
        kernel = make_op("w8a8_linear", impl)
        ws = _layers(kernel, shapes, layers, gen)
        tiny = [(kernel.pack(torch.ones(16, k, dtype=torch.int8)), torch.ones(16), k, 16) for _, _, k, _ in ws]

        def step(ws=ws, kernel=kernel):
            for packed, scale, k, _ in ws:
                kernel(xs[k], packed, scale)

        def fixed(tiny=tiny, kernel=kernel):
            for packed, scale, k, _ in tiny:
                kernel(xs[k], packed, scale)

        t = _median_time(step, repeats)
        tf = _median_time(fixed, repeats)
        per_shape = {}
        for name, (n, k) in shapes.items():
            sel = [w for w in ws if w[2] == k and w[3] == n]

            def one(sel=sel, kernel=kernel):
                for packed, scale, kk, _ in sel:
                    kernel(xs[kk], packed, scale)

            ts = _median_time(one, repeats)
            per_shape[name] = {"us_per_call": round(ts / len(sel) * 1e6, 1),
                               "gb_s": round(len(sel) * n * k / ts / 1e9, 1)}
        res[impl] = {"step_ms": round(t * 1e3, 3), "gb_s": round(weight_bytes / t / 1e9, 1),
                     "fixed_us_per_call": round(tf / len(ws) * 1e6, 2), "fixed_share": round(tf / t, 3),
                     "shapes": per_shape}
    # yardstick: the bf16 GEMV the unquantized model runs
    lin = make_op("linear", _best_linear())
    bw = []
    for _ in range(layers):
        for n, k in shapes.values():
            bw.append((torch.randn(n, k, generator=gen).to(torch.bfloat16), k))

    def bf16_step():
        for w, k in bw:
            lin(xs[k], w)

    tb = _median_time(bf16_step, repeats)
    res["bf16 linear"] = {"step_ms": round(tb * 1e3, 3), "gb_s": round(2 * weight_bytes / tb / 1e9, 1)}
    return {"rows": rows, "layers": layers, "int8_weight_mb": round(weight_bytes / 1e6, 1),
            "threads": torch.get_num_threads(), "results": res}


def _best_linear() -> str:
    usable = [i for i, why in implementations("linear") if not why and i != "torch-native"]
    return usable[-1] if usable else "torch-native"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m anycore.bench.int8_gemv")
    p.add_argument("--impls", default="", help="comma list (default: every usable implementation)")
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--rows", type=int, default=1, help="activation rows (1 = decode)")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    impls = [i for i in a.impls.split(",") if i] or None
    r = bench_int8_gemv(impls, layers=a.layers, rows=a.rows, repeats=a.repeats)
    if a.json:
        print(json.dumps(r, indent=1))
        return
    print(f"M={r['rows']}, {r['layers']} layers, {r['int8_weight_mb']} MB int8, {r['threads']} threads")
    for impl, v in r["results"].items():
        line = f"  {impl:<14} step {v['step_ms']:8.3f} ms  {v['gb_s']:6.1f} GB/s"
        if "fixed_us_per_call" in v:
            line += f"  fixed {v['fixed_us_per_call']:.2f} us/call ({v['fixed_share']:.0%} of step)  "
            line += "  ".join(f"{s} {d['gb_s']} GB/s" for s, d in v["shapes"].items())
        print(line)


if __name__ == "__main__":
    main()
