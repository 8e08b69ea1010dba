"""GGUF files for `anycore bench compare`: a file's weight type, tensor bytes and shape, and
re-quantized copies (Q8_0, F16, ...) of the shipped model for llama.cpp, cached on disk.

Reading a GGUF here touches its header and tensor table only (the reader memory-maps the file),
once per process, so argument checks may call these before any model is loaded.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from anycore.bench.peers.base import PeerUnavailable, require

# llama.cpp file types for llama_model_quantize (llama.h: LLAMA_FTYPE_MOSTLY_*)
GGUF_FTYPES = {"F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_name: str  # e.g. 'Q4_1'
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int


@dataclass(frozen=True)
class GGUFSummary:
    """What the harness reads from a GGUF: its integer metadata and its tensor table."""

    arch: str
    ints: dict[str, int]  # integer metadata fields without the "<arch>." prefix
    tensors: tuple[TensorInfo, ...]


def summary(path: Path) -> GGUFSummary:
    """The file's summary, parsed once per process and file version (gguf's reader takes seconds
    on a 100 MB model: it decodes the whole vocabulary)."""
    st = Path(path).stat()
    return _summary(str(Path(path).resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=16)
def _summary(path: str, _mtime_ns: int, _size: int) -> GGUFSummary:
    from gguf import GGUFReader

    r = GGUFReader(path)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    ints = {}
    for key, f in r.fields.items():
        if key.startswith(arch + ".") and len(f.data) == 1 and f.parts[f.data[0]].dtype.kind in "iu":
            ints[key[len(arch) + 1:]] = int(f.parts[f.data[0]][0])
    tensors = tuple(TensorInfo(t.name, t.tensor_type.name, tuple(int(x) for x in t.shape), int(t.n_elements),
                               int(t.n_bytes)) for t in r.tensors)
    return GGUFSummary(arch, ints, tensors)


def gguf_type(path: Path) -> str:
    """The dominant weight type of a GGUF file (that of blk.0's FFN or experts), e.g. 'Q4_1'."""
    return next((t.type_name for t in summary(path).tensors if t.name.endswith(("ffn_up.weight", "ffn_up_exps.weight"))),
                "unknown")


def gguf_stats(path: Path) -> dict[str, float]:
    """Tensor bytes (what one decode step streams) and the parameters that multiply per token."""
    tensors = summary(path).tensors
    total = sum(t.n_bytes for t in tensors)
    per_token = sum(t.n_elements for t in tensors if t.name.startswith("blk.") and len(t.shape) == 2)
    return {"tensor_bytes": total, "block_matmul_params": per_token}


def model_shape(path: Path) -> dict[str, int]:
    """Layers, hidden size, query width and vocabulary of a GGUF model (for its prefill FLOPs)."""
    s = summary(path)
    vocab = next((t.shape[-1] for t in s.tensors if t.name == "token_embd.weight"), 0)
    hidden = s.ints["embedding_length"]
    heads = s.ints["attention.head_count"]
    return {"layers": s.ints["block_count"], "hidden": hidden, "q_dim": hidden // heads * heads, "vocab": vocab}


def context_length(path: Path) -> int | None:
    """The context length a GGUF model declares (None when it declares none)."""
    return summary(path).ints.get("context_length")


def prefill_flops_per_token(path: Path, prompt_tokens: int) -> float:
    """Model FLOPs per prefilled token of a ``prompt_tokens`` prompt: block matmuls + causal
    attention (QK^T and PV) + one logits row spread over the prompt."""
    st, mc, t = gguf_stats(path), model_shape(path), prompt_tokens
    attn = 2 * 2 * mc["layers"] * mc["q_dim"] * (t + 1) / 2
    return 2 * st["block_matmul_params"] + attn + 2 * mc["vocab"] * mc["hidden"] / t


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
