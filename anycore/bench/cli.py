"""`anycore bench <latency|throughput|serving|compare|moe|speculative|tp>`: the flags of each benchmark and the
hand-off to its module. Every benchmark checks its flags before it loads or measures anything;
a bad one ends the command with one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from anycore.bench.checks import BenchArgumentError
from anycore.config import EngineConfig


def add_bench_args(parser: argparse.ArgumentParser, add_engine_args: Callable[[argparse.ArgumentParser], None]) -> None:
    from anycore.bench.compare.args import add_compare_args
    from anycore.bench.serving import add_serving_args

    sub = parser.add_subparsers(dest="bench", required=True)
    for kind, defaults in (("latency", (512, 128)), ("throughput", (128, 128))):
        p = sub.add_parser(kind, help=f"offline {kind} (engine in-process)")
        add_engine_args(p)
        p.add_argument("--bench-dtype", default="both", choices=["both", "bfloat16", "float32"],
                       help="dtypes to measure (default both)")
        p.add_argument("--input-len", type=int, default=defaults[0])
        p.add_argument("--output-len", type=int, default=defaults[1])
        p.add_argument("--num-prompts", type=int, default=16)
        p.add_argument("--repeats", type=int, default=3)
        p.add_argument("--json", default=None,
                       help=f"also write the results to this JSON file (a folder: {kind}.json in it)")
    serving = sub.add_parser("serving", help="load-test an OpenAI-compatible server (ours or any other)")
    add_serving_args(serving)
    compare = sub.add_parser("compare", help="anycore vs llama.cpp and transformers, same model and prompts")
    add_engine_args(compare)
    add_compare_args(compare)
    from anycore.bench.moe import add_moe_args

    add_moe_args(sub.add_parser("moe", help="a random ~1B Mixture-of-Experts model: anycore vs transformers"))
    from anycore.bench.speculative import add_speculative_args
    from anycore.bench.tensor_parallel import add_tp_args

    spec = sub.add_parser("speculative", help="batch-1 decode with and without speculative decoding (vs llama-server)")
    add_engine_args(spec)
    add_speculative_args(spec)
    tp = sub.add_parser("tp", help="tensor parallel: all-reduce latency, TP=N vs TP=1 decode tok/s")
    add_engine_args(tp)
    add_tp_args(tp)


def run_bench(args: argparse.Namespace, config: EngineConfig | None) -> int:
    try:
        return _dispatch(args, config)
    except BenchArgumentError as e:
        print(f"anycore bench {args.bench}: error: {e}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace, config: EngineConfig | None) -> int:
    if args.bench in ("latency", "throughput"):
        from anycore.bench.offline import bench_offline

        assert config is not None
        return bench_offline(args.bench, args, config)
    if args.bench == "serving":
        from anycore.bench.serving import run_serving

        return run_serving(args)
    if args.bench == "compare":
        from anycore.bench.compare.run import run_compare

        assert config is not None
        return run_compare(args, config)
    if args.bench == "moe":
        from anycore.bench.moe import run_moe_bench

        return run_moe_bench(args)
    if args.bench == "speculative":
        from anycore.bench.speculative import run_speculative

        assert config is not None
        return run_speculative(args, config)
    if args.bench == "tp":
        from anycore.bench.tensor_parallel import run_tp

        assert config is not None
        return run_tp(args, config)
    raise ValueError(f"unknown benchmark {args.bench!r}")
