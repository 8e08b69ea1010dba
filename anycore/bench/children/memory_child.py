"""Child program: the resident memory of one engine at three points (`anycore bench compare`'s
memory workload; the parent is ``anycore.bench.memory``).

    python anycore/bench/children/memory_child.py '{"engine": "anycore", "config": {...}, "gen_tokens": 32}'
    python anycore/bench/children/memory_child.py '{"engine": "llama-cpp", "gguf": "m.gguf", "threads": 2, "gen_tokens": 32}'

Reads ``/proc/self/status`` after importing the engine's package (the runtime's own share), after
loading the model, and after a 16-token prompt plus ``gen_tokens`` greedy tokens; prints one
``RSS-JSON {...}`` line. Only json and sys are imported before the first point, so that point is
the engine's import and nothing of this harness.
"""

from __future__ import annotations

import json
import sys

RESULT_MARKER = "RSS-JSON "
STATUS_KEYS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")
PROMPT = list(range(1000, 1016))  # the same 16 ids for every engine


def read_status() -> dict[str, int]:
    """This process's memory counters from /proc/self/status, in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in STATUS_KEYS:
                out[key] = int(rest.split()[0]) * 1024
    return out


def anycore_rss(config: dict, gen_tokens: int) -> dict:
    from anycore.config import EngineConfig
    from anycore.engine.engine import Engine
    from anycore.sampling_params import SamplingParams

    report: dict = {"import": read_status()}
    engine = Engine(EngineConfig(**config))
    report["load"] = read_status()
    report["weight_bytes"] = engine.weight_bytes
    engine.add_request(list(PROMPT), SamplingParams(temperature=0, max_tokens=gen_tokens, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    report["generate"] = read_status()
    return report


def llama_cpp_rss(gguf: str, threads: int, gen_tokens: int) -> dict:
    """Same settings as the offline llama.cpp runner (peers/llama_cpp.py): n_ctx 2048, batch 512."""
    import llama_cpp

    report: dict = {"import": read_status()}
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=threads,
                          n_threads_batch=threads, verbose=False)
    report["load"] = read_status()
    llm.eval(list(PROMPT))
    for _ in range(gen_tokens):
        llm.eval([1000])
    report["generate"] = read_status()
    return report


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: memory_child.py '<JSON arguments>'", file=sys.stderr)
        return 2
    args = json.loads(argv[0])
    if args["engine"] == "anycore":
        report = anycore_rss(args["config"], int(args["gen_tokens"]))
    elif args["engine"] == "llama-cpp":
        report = llama_cpp_rss(args["gguf"], int(args["threads"]), int(args["gen_tokens"]))
    else:
        print(f"unknown engine {args['engine']!r}; expected 'anycore' or 'llama-cpp'", file=sys.stderr)
        return 2
    print(RESULT_MARKER + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
