"""In-process engines for `anycore bench compare`: anycore, llama.cpp (llama-cpp-python), transformers.

Each runner loads once and then answers ``decode`` (batch-1 output tok/s over ``n`` tokens after a
16-token prompt), ``prefill`` (tok/s for one ``n``-token prompt) and ``batch`` (aggregate output
tok/s of ``num`` prompts generated together; None where the engine has no batched path).
Prompts are random token ids from a seeded generator shared by every engine, so all engines see
the same token sequences and none gets a prefix-cache hit from an earlier repeat.
A peer whose package is missing raises ``PeerUnavailable``; the harness reports it as skipped.
"""

from __future__ import annotations

import importlib
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# llama.cpp file types for llama_model_quantize (llama.h: LLAMA_FTYPE_MOSTLY_*)
GGUF_FTYPES = {"F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7}


class PeerUnavailable(RuntimeError):
    """A peer that cannot run here (package missing, build failed); reported as skipped."""


def require(module: str, hint: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise PeerUnavailable(f"{module} not importable ({e}); {hint}") from None


def random_prompt(rng: random.Random, n: int, lo: int = 1000, hi: int = 10000) -> list[int]:
    return [rng.randrange(lo, hi) for _ in range(n)]


# ---- GGUF files -------------------------------------------------------------------------------
def gguf_type(path: Path) -> str:
    """The dominant weight type of a GGUF file (that of blk.0's FFN), e.g. 'Q4_1'."""
    from gguf import GGUFReader

    for t in GGUFReader(str(path)).tensors:
        if t.name.endswith("ffn_up.weight"):
            return t.tensor_type.name
    return "unknown"


def gguf_stats(path: Path) -> dict[str, float]:
    """Tensor bytes (what one decode step streams) and the parameters that multiply per token."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    total = sum(int(t.n_bytes) for t in reader.tensors)
    per_token = sum(int(t.n_elements) for t in reader.tensors
                    if t.name.startswith("blk.") and len(t.shape) == 2)
    return {"tensor_bytes": total, "block_matmul_params": per_token}


def gguf_variant(src: Path, qtype: str, cache_dir: Path) -> Path:
    """``src`` re-quantized to ``qtype`` (cached); the source itself when it already is that type."""
    if gguf_type(src) == qtype:
        return src
    if qtype not in GGUF_FTYPES:
        raise ValueError(f"unsupported GGUF type {qtype!r}; choose from {sorted(GGUF_FTYPES)}")
    dst = cache_dir / f"{src.stem.rsplit('.', 1)[0]}.{qtype}.gguf"
    if dst.exists():
        return dst
    llama_cpp = require("llama_cpp", "pip install -e .[bench]")
    cache_dir.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = GGUF_FTYPES[qtype]
    params.allow_requantize = True  # the source is already quantized (Q4_1): F16/Q8_0 from it are exact copies of its values
    tmp = dst.with_suffix(".tmp")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        raise PeerUnavailable(f"llama_model_quantize to {qtype} failed (rc {rc})")
    tmp.rename(dst)
    return dst


# ---- runners -----------------------------------------------------------------------------------
@dataclass
class Runner:
    name: str
    dtype_class: str  # which peak GEMM its prefill is measured against: fp32 | bf16 | int8
    weight_bytes: int
    info: dict[str, Any] = field(default_factory=dict)

    def decode(self, n: int, rng: random.Random) -> float:
        raise NotImplementedError

    def prefill(self, n: int, rng: random.Random) -> float:
        raise NotImplementedError

    def batch(self, num: int, input_len: int, output_len: int, rng: random.Random) -> float | None:
        return None

    def close(self) -> None:
        pass


class AnycoreRunner(Runner):
    def __init__(self, name: str, config: Any) -> None:
        from dataclasses import replace

        from anycore.engine.engine import Engine

        self.engine = Engine(replace(config, max_num_batched_tokens=max(config.max_num_batched_tokens, 512)))
        dtype_class = "int8" if self.engine.quantization else ("bf16" if config.dtype == "bfloat16" else "fp32")
        super().__init__(name, dtype_class, self.engine.weight_bytes,
                         {"kernels": dict(self.engine.ops.choices), "quantization": self.engine.quantization})
        self.decode(8, random.Random(-1))  # warm-up

    def decode(self, n: int, rng: random.Random) -> float:
        from anycore.bench.offline import measure_decode

        return measure_decode(self.engine, n, _IdRng(rng))

    def prefill(self, n: int, rng: random.Random) -> float:
        from anycore.bench.offline import measure_prefill

        return measure_prefill(self.engine, n, _IdRng(rng))

    def batch(self, num: int, input_len: int, output_len: int, rng: random.Random) -> float | None:
        from anycore.bench.offline import measure_throughput

        return measure_throughput(self.engine, num, input_len, output_len, _IdRng(rng))["output_tok_s"]


class _IdRng:
    """Makes offline.py's ``rng.randrange(256, vocab)`` draw the same ids as ``random_prompt``."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def randrange(self, _lo: int, _hi: int) -> int:
        return self._rng.randrange(1000, 10000)


def probe_llama_cpp(path: Path, threads: int, timeout: float = 600.0) -> None:
    """Loads ``path`` and evaluates a few tokens in a child process first: a llama.cpp build that
    uses an instruction this machine traps (seen: AMX tiles advertised by a VM but not enabled)
    dies with SIGILL, which in-process would take the whole benchmark down."""
    import subprocess
    import sys

    code = ("import llama_cpp, sys; m = llama_cpp.Llama(model_path=sys.argv[1], n_threads=int(sys.argv[2]), "
            "n_threads_batch=int(sys.argv[2]), n_ctx=256, verbose=False); m.eval(list(range(1000, 1040)))")
    try:
        r = subprocess.run([sys.executable, "-c", code, str(path), str(threads)], capture_output=True, text=True,
                           timeout=timeout)
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
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=threads,
                                   n_threads_batch=threads, verbose=False)
        self.n_vocab = self.llm.n_vocab()
        qtype = gguf_type(path)
        super().__init__(name, "bf16" if qtype in ("F16", "BF16") else ("fp32" if qtype == "F32" else "int8"),
                         gguf_stats(path)["tensor_bytes"], {"file": str(path), "type": qtype, "threads": threads})
        self.decode(8, random.Random(-1))

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


class TransformersRunner(Runner):
    def __init__(self, name: str, gguf_path: Path, dtype: str, threads: int) -> None:
        import torch

        transformers = require("transformers", "pip install transformers accelerate gguf")
        torch.set_num_threads(threads)
        self.torch = torch
        tdtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=tdtype).eval()
        import inspect

        # transformers 5.x renamed the KV-cache argument from past_key_values to cache
        self._cache_kw = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        wb = sum(p.numel() * p.element_size() for p in self.model.parameters())
        super().__init__(name, dtype, wb, {"dtype": dtype, "threads": threads})
        self.decode(8, random.Random(-1))

    def decode(self, n: int, rng: random.Random) -> float:
        torch = self.torch
        with torch.inference_mode():
            out = self.model(torch.tensor([random_prompt(rng, 16)]), use_cache=True, logits_to_keep=1)
            cache, tok = self._cache(out), out.logits[:, -1].argmax(-1, keepdim=True)
            t0 = time.perf_counter()
            for _ in range(n):
                out = self.model(tok, use_cache=True, **{self._cache_kw: cache})
                cache, tok = self._cache(out), out.logits[:, -1].argmax(-1, keepdim=True)
            return n / (time.perf_counter() - t0)

    @staticmethod
    def _cache(out: Any) -> Any:
        cache = getattr(out, "cache", None)
        return cache if cache is not None else out.past_key_values

    def prefill(self, n: int, rng: random.Random) -> float:
        torch = self.torch
        ids = torch.tensor([random_prompt(rng, n)])
        with torch.inference_mode():
            t0 = time.perf_counter()
            self.model(ids, use_cache=True, logits_to_keep=1).logits.argmax(-1)
            return n / (time.perf_counter() - t0)

    def batch(self, num: int, input_len: int, output_len: int, rng: random.Random) -> float | None:
        torch = self.torch
        ids = torch.tensor([random_prompt(rng, input_len) for _ in range(num)])
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=output_len, min_new_tokens=output_len, pad_token_id=0)
            dt = time.perf_counter() - t0
        return (out.shape[1] - input_len) * num / dt
