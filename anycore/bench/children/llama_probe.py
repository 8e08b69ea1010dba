"""Child program: loads a GGUF in llama.cpp and evaluates a few tokens, so that a build using an
instruction this machine traps dies here (SIGILL) and not inside the benchmark's own process.

    python anycore/bench/children/llama_probe.py '{"gguf": "m.gguf", "threads": 2}'

Exit status 0: llama.cpp works on this file; a signal or another status: it does not.
"""

from __future__ import annotations

import json
import sys


def probe(gguf: str, threads: int) -> None:
    import llama_cpp

    m = llama_cpp.Llama(model_path=gguf, n_threads=threads, n_threads_batch=threads, n_ctx=256, verbose=False)
    m.eval(list(range(1000, 1040)))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: llama_probe.py '<JSON arguments>'", file=sys.stderr)
        return 2
    args = json.loads(argv[0])
    probe(args["gguf"], int(args["threads"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
