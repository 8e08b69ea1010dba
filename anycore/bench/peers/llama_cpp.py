"""llama.cpp in-process (llama-cpp-python) for `anycore bench compare`, after a probe of the same
file in a child process."""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path

from anycore.bench.children import run_child
from anycore.bench.peers.base import PeerUnavailable, Runner, random_prompt, require
from anycore.bench.peers.gguf_files import gguf_stats, gguf_type

LLAMA_N_CTX = 2048  # the context the offline runner opens: decode and prefill prompts must fit


def probe_llama_cpp(path: Path, threads: int, timeout: float = 600.0) -> None:
    """Loads ``path`` and evaluates a few tokens in a child process first: a llama.cpp build that
    uses an instruction this machine traps (seen: AMX tiles advertised by a VM but not enabled)
    dies with SIGILL, which in-process would take the whole benchmark down."""
    try:
        r = run_child("llama_probe", {"gguf": str(path), "threads": threads}, timeout)
    except subprocess.TimeoutExpired:
        raise PeerUnavailable(f"llama.cpp probe on {path.name} timed out after {timeout:.0f}s") from None
    if r.returncode < 0:
        raise PeerUnavailable(
            f"llama.cpp crashed on {path.name} (signal {-r.returncode}); a SIGILL (4) means the build uses CPU "
            "instructions this machine traps - rebuild llama-cpp-python with explicit ISA flags, e.g. "
            "CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX512=ON ...'")
    if r.returncode != 0:
        raise PeerUnavailable(f"llama.cpp probe failed on {path.name}: {r.stderr.strip()[-300:]}")


class LlamaCppRunner(Runner):
    def __init__(self, name: str, path: Path, threads: int) -> None:
        llama_cpp = require("llama_cpp", "pip install -e .[bench]")
        probe_llama_cpp(path, threads)
        import numpy as np

        self._np = np
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=LLAMA_N_CTX, n_batch=512, n_ubatch=512, n_threads=threads,
                                   n_threads_batch=threads, verbose=False)
        self.n_vocab = self.llm.n_vocab()
        qtype = gguf_type(path)
        super().__init__(name, "bf16" if qtype in ("F16", "BF16") else ("fp32" if qtype == "F32" else "int8"),
                         gguf_stats(path)["tensor_bytes"], {"file": str(path), "type": qtype, "threads": threads})
        self.decode(8, random.Random(-1))  # warm-up

    def _argmax(self) -> int:
        # llama-cpp-python >= 0.3.x: eval() no longer fills .scores; the context holds the last logits
        ptr = self.llm._ctx.get_logits()
        return int(self._np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).argmax())

    def decode(self, n: int, rng: random.Random) -> float:
        self.llm.reset()
        self.llm.eval(random_prompt(rng, 16))
        tok = self._argmax()
        t0 = time.perf_counter()
        for _ in range(n):
            self.llm.eval([tok])
            tok = self._argmax()
        return n / (time.perf_counter() - t0)

    def prefill(self, n: int, rng: random.Random) -> float:
        prompt = random_prompt(rng, n)
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(prompt)
        self._argmax()
        return n / (time.perf_counter() - t0)

    def close(self) -> None:
        self.llm.close()
