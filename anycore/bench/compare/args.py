"""The flags of `anycore bench compare` (the engine's own flags come from ``anycore.cli``), and
their check before any model load or measurement.

``check_compare`` turns the flags into ``CompareInputs``, the values the run uses: the result
file (an ``--out`` folder becomes ``result.json`` inside it), the GGUF model, parsed lists. A bad
value raises ``BenchArgumentError`` naming the flag; the CLI prints it as one line, exit status 2.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from anycore.bench import checks
from anycore.bench.checks import BenchArgumentError
from anycore.bench.peers.gguf_files import GGUF_FTYPES, context_length, gguf_type
from anycore.bench.peers.llama_cpp import LLAMA_N_CTX
from anycore.bench.peers.servers import LLAMA_SERVER_SLOT_CTX
from anycore.bench.peers.transformers_runner import HF_DTYPES
from anycore.config import EngineConfig

WORKLOADS = ("decode", "prefill", "batch", "memory", "serve", "prefix")
OFFLINE_WORKLOADS = ("decode", "prefill", "batch")
SERVING_WORKLOADS = ("serve", "prefix")
PEERS = ("llama-cpp", "llama-server", "transformers")
DEFAULT_OUT = "bench-compare/result.json"
RESULT_NAME = "result.json"  # the file written inside an --out folder


def add_compare_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("compare")
    g.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma list of {', '.join(WORKLOADS)}")
    g.add_argument("--peers", default=",".join(PEERS), help=f"comma list of {', '.join(PEERS)} (or 'none')")
    g.add_argument("--gguf-types", default="Q4_1,Q8_0,F16", help="llama.cpp offline: GGUF types to run")
    g.add_argument("--server-gguf-types", default="Q8_0", help="llama-server: GGUF types to serve")
    g.add_argument("--hf-dtypes", default="bf16,fp32", help="transformers dtypes")
    g.add_argument("--no-anycore-server", action="store_true", help="skip anycore's own server in serve/prefix")
    g.add_argument("--kernels-off", action="store_true",
                   help="offline: also run anycore bf16 on the torch-native ops (kernels on vs off)")
    g.add_argument("--repeats", type=int, default=3)
    g.add_argument("--decode-tokens", type=int, default=128)
    g.add_argument("--prefill-tokens", type=int, default=512)
    g.add_argument("--batch-prompts", type=int, default=16)
    g.add_argument("--batch-input-len", type=int, default=128)
    g.add_argument("--batch-output-len", type=int, default=128)
    g.add_argument("--concurrency", default="1,4,16", help="serving concurrency levels")
    g.add_argument("--serve-input-len", type=int, default=100)
    g.add_argument("--serve-output-len", type=int, default=128)
    g.add_argument("--memory-gen-tokens", type=int, default=32, help="memory: tokens generated before the 2nd RSS")
    g.add_argument("--memory-models", default="",
                   help="memory: comma list of further checkpoints (HF folders or GGUF files) whose RSS is measured "
                        "too, anycore engines only, rows tagged with the file name: on a small model the runtime's "
                        "own ~220 MB hides what quantization saves")
    g.add_argument("--prefix-len", type=int, default=992, help="shared-prefix workload: prefix tokens (suffixes: 20)")
    g.add_argument("--prompts-per-slot", type=int, default=4, help="serving requests per level = this x concurrency (min 4)")
    g.add_argument("--quick", action="store_true",
                   help="1 repeat, 32 decode tokens, batch 4x(64 in, 32 out), concurrency 1,4, 2 prompts per slot")
    g.add_argument("--out", default=DEFAULT_OUT,
                   help=f"JSON file, or a folder to write {RESULT_NAME} in; charts and server logs go next to it")
    g.add_argument("--cache-dir", default=str(Path.home() / ".cache/anycore/peers"),
                   help="GGUF copies, the llama-server build, the bandwidth probe")
    g.add_argument("--no-build", action="store_true", help="never build llama-server; skip it when not cached")
    g.add_argument("--llama-cmake-args", default="",
                   help="extra CMake args for the llama-server build, e.g. '-DGGML_NATIVE=OFF -DGGML_AVX512=ON' "
                        "where the native build uses instructions the machine traps (a VM advertising AMX)")
    g.add_argument("--settle", type=float, default=0.3, help="seconds of idle between measurements")
    g.add_argument("--noise-cores", type=float, default=0.15, help="flag a cell when others used more cores")
    g.add_argument("--noise-cv", type=float, default=0.10, help="flag a cell whose repeats spread more")
    g.add_argument("--retry-noisy", type=int, default=0,
                   help="offline: measure a repeat again (up to N more times) when other processes used more than "
                        "--noise-cores while it ran; the discarded attempts are counted in the JSON")
    g.add_argument("--quiet-wait", type=float, default=0.0,
                   help="offline: before each attempt, wait up to this many seconds for a second in which other "
                        "processes use less than --noise-cores (shared machines)")


def apply_quick(args: argparse.Namespace) -> None:
    if args.quick:
        args.repeats, args.decode_tokens = 1, min(args.decode_tokens, 32)
        args.batch_prompts, args.batch_input_len, args.batch_output_len = 4, 64, 32
        args.concurrency, args.prompts_per_slot = "1,4", 2


# flags whose value is a count of tokens, prompts or repeats: >= 1
POSITIVE_INT_FLAGS = ("repeats", "decode_tokens", "prefill_tokens", "batch_prompts", "batch_input_len",
                      "batch_output_len", "serve_input_len", "serve_output_len", "memory_gen_tokens", "prefix_len",
                      "prompts_per_slot")
# seconds, thresholds and retry counts: >= 0
NON_NEGATIVE_FLAGS = ("settle", "noise_cores", "noise_cv", "retry_noisy", "quiet_wait")
DECODE_PROMPT = 16  # tokens before the timed decode (peers/base.py)
PREFIX_SUFFIX, PREFIX_MAX_TOKENS = 20, 8  # the shared-prefix workload's suffix and output (serve_workloads.py)


@dataclass(frozen=True)
class CompareInputs:
    out: Path  # the result JSON; charts and server logs go next to it
    model: Path  # the GGUF every engine reads
    workloads: list[str]
    peers: list[str]
    gguf_types: list[str]
    server_gguf_types: list[str]
    hf_dtypes: list[str]
    concurrency: list[int]
    memory_models: list[Path]
    cache_dir: Path


def check_compare(args: argparse.Namespace, config: EngineConfig) -> CompareInputs:
    out = checks.output_file(args.out, RESULT_NAME, "--out")
    workloads = checks.names(args.workloads, WORKLOADS, "--workloads")
    peers = checks.names(args.peers, PEERS, "--peers", allow_none=True, required=False)
    hf_dtypes = checks.names(args.hf_dtypes, HF_DTYPES, "--hf-dtypes", allow_none=True, required=False)
    for flag in POSITIVE_INT_FLAGS:
        checks.at_least(getattr(args, flag), 1, _flag(flag))
    for flag in NON_NEGATIVE_FLAGS:
        checks.at_least(getattr(args, flag), 0, _flag(flag))
    checks.threads(config.threads)
    concurrency = checks.positive_ints(args.concurrency, "--concurrency")
    cache_dir = checks.creatable_dir(Path(args.cache_dir).expanduser(), "--cache-dir")
    model = checks.gguf_file(config.model)
    memory_models = [checks.model_source(m, "--memory-models") for m in _csv(args.memory_models)]
    gguf_types = _gguf_types(args.gguf_types, "--gguf-types", model)
    server_gguf_types = _gguf_types(args.server_gguf_types, "--server-gguf-types", model)
    _check_lengths(args, config, model, workloads, peers)
    return CompareInputs(out, model, workloads, peers, gguf_types, server_gguf_types, hf_dtypes, concurrency,
                         memory_models, cache_dir)


def _flag(attr: str) -> str:
    return "--" + attr.replace("_", "-")


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _gguf_types(value: str, flag: str, model: Path) -> list[str]:
    """Types llama_model_quantize can write, or the model's own (used as shipped)."""
    items = [] if value.strip().lower() == "none" else _csv(value)
    if any(t not in GGUF_FTYPES for t in items):
        return checks.names(value, (*GGUF_FTYPES, gguf_type(model)), flag, allow_none=True, required=False)
    return items


def _check_lengths(args: argparse.Namespace, config: EngineConfig, model: Path, workloads: list[str],
                   peers: list[str]) -> None:
    """Each workload's longest sequence fits the context it runs in (the model's, or
    --max-model-len; llama.cpp's offline runner opens LLAMA_N_CTX)."""
    longest: dict[str, tuple[int, str]] = {
        "decode": (DECODE_PROMPT + args.decode_tokens + 1, "16 + --decode-tokens + 1"),
        "prefill": (args.prefill_tokens + 1, "--prefill-tokens + 1"),
        "batch": (args.batch_input_len + args.batch_output_len, "--batch-input-len + --batch-output-len"),
        "serve": (args.serve_input_len + args.serve_output_len, "--serve-input-len + --serve-output-len"),
        "prefix": (args.prefix_len + PREFIX_SUFFIX + PREFIX_MAX_TOKENS, f"--prefix-len + {PREFIX_SUFFIX + PREFIX_MAX_TOKENS}"),
    }
    ctx = config.max_model_len or context_length(model)
    for w in workloads:
        if w not in longest:
            continue
        tokens, what = longest[w]
        if ctx is not None and tokens > ctx:
            raise BenchArgumentError(f"{what} = {tokens} tokens exceeds the context of {ctx} ({model.name}"
                                     f"{', --max-model-len' if config.max_model_len else ''})")
        # llama-cpp-python has no batch cell; llama-server splits its context over its slots
        if w in OFFLINE_WORKLOADS and w != "batch" and "llama-cpp" in peers and tokens > LLAMA_N_CTX:
            raise BenchArgumentError(f"{what} = {tokens} tokens exceeds llama.cpp's context of {LLAMA_N_CTX} "
                                     "(drop llama-cpp from --peers)")
        if w in SERVING_WORKLOADS and "llama-server" in peers and tokens > LLAMA_SERVER_SLOT_CTX:
            raise BenchArgumentError(f"{what} = {tokens} tokens exceeds llama-server's {LLAMA_SERVER_SLOT_CTX} "
                                     "per slot (drop llama-server from --peers)")
