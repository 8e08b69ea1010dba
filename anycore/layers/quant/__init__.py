"""Quantization methods for linear layers, by name (`--quantization NAME`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from tqdm import tqdm

from anycore.layers.embedding import LogitsHead, VocabEmbedding
from anycore.layers.linear import Linear
from anycore.layers.moe import StackedExperts
from anycore.layers.quant.gguf_blocks import GGUF, GGUFLinearMethod
from anycore.layers.quant.moe_smoothing import smooth_sparse_mlp
from anycore.layers.quant.smoothing import collect_input_stats, smooth
from anycore.layers.quant.w8a8_int8 import W8A8Int8LinearMethod

QUANTIZATION_METHODS = {"w8a8_int8": W8A8Int8LinearMethod, GGUF: GGUFLinearMethod}


def linear_method_factory(name: str | None, prequantized: bool = False):
    """A zero-argument factory of LinearMethods for ``name`` (None: dense layers)."""
    if name is None:
        return None
    try:
        cls = QUANTIZATION_METHODS[name]
    except KeyError:
        raise ValueError(f"unknown quantization {name!r}; supported: {sorted(QUANTIZATION_METHODS)}") from None
    return lambda: cls(prequantized=prequantized)


NONE = "none"  # dense weights, a GGUF file's dequantized


def resolve_quantization(requested: str | None, hf_config: dict, source_format: str = "hf",
                         dtype: torch.dtype | None = None, has_blocks: bool = False) -> tuple[str | None, bool]:
    """(method name, pre-quantized?) from the user's flag and the checkpoint's own config.
    ``gguf`` (the file's own blocks) is pre-quantized and needs a GGUF file. ``None`` (the
    default, auto): a GGUF file with projections in block types the kernels run (``has_blocks``)
    is served as ``gguf`` when ``dtype`` is bfloat16 (fp32, the oracle's dtype, keeps the
    dequantized weights); ``"none"``: dense (dequantized) weights."""
    if requested is None and source_format == "gguf" and has_blocks and dtype == torch.bfloat16:
        requested = GGUF
    if requested == NONE:
        if hf_config.get("quantization_config"):
            raise ValueError("the checkpoint is pre-quantized; quantization 'none' cannot dequantize it")
        return None, False
    if requested == GGUF:
        if source_format != "gguf":
            raise ValueError("quantization 'gguf' serves a GGUF file's own weight blocks; this model is not a GGUF file")
        return GGUF, True
    qc = hf_config.get("quantization_config")
    if not qc:
        if requested is not None and requested not in QUANTIZATION_METHODS:
            raise ValueError(f"unknown quantization {requested!r}; supported: {sorted(QUANTIZATION_METHODS)}")
        return requested, False
    from anycore.layers.quant.compressed_tensors import method_of

    found = method_of(qc)
    if requested is not None and requested != found:
        raise ValueError(f"the checkpoint is pre-quantized as {found}; it cannot be served as {requested}")
    return found, True


def quantize_online(model: nn.Module, make_method: Callable, run_calibration: Callable[[], object],
                    alpha: float | None = None, lm_head: bool = False, embedding: bool = False) -> None:
    """Smooths activation outliers into the weights (when the model declares where; ``alpha``
    None: searched per pair, see smoothing.py), then switches every Linear to the quantized
    method and converts its weights. ``lm_head``: the logits head too
    (``LogitsHead.quantize_int8``, smoothed with the same calibration pass, alpha 0.5).
    ``embedding``: the token embedding table too: its own int8 rows
    (``VocabEmbedding.quantize_int8``), or, tied to the head, the int8 head's rows
    (``share_int8_head``; so a tied table needs ``lm_head``, else the float head would keep it)."""
    if embedding:
        _check_embedding_quantizable(model, lm_head)
    _quantize(model, make_method, run_calibration, alpha, lm_head)
    if embedding:
        heads = {id(m.tied_to): m for m in model.modules() if isinstance(m, LogitsHead) and m.tied_to is not None}
        for m in model.modules():
            if isinstance(m, VocabEmbedding):
                if id(m) in heads:
                    m.share_int8_head(heads[id(m)])
                else:
                    m.quantize_int8()
    release_free_heap()  # after _quantize's locals (views of float weights among them) are gone


def _check_embedding_quantizable(model: nn.Module, lm_head: bool) -> None:
    tied = any(isinstance(m, LogitsHead) and m.tied_to is not None for m in model.modules())
    if not any(isinstance(m, VocabEmbedding) for m in model.modules()):
        raise ValueError(f"{type(model).__name__} has no VocabEmbedding to quantize")
    if tied and not lm_head:
        raise ValueError("the logits head is tied to the embedding: quantize_embedding needs quantize_lm_head "
                         "(a float head would keep the float table)")


def _quantize(model: nn.Module, make_method: Callable, run_calibration: Callable[[], object],
              alpha: float | None, lm_head: bool) -> None:
    pairs = model.smooth_pairs() if hasattr(model, "smooth_pairs") else []
    sparse = model.sparse_mlp_smoothing() if hasattr(model, "sparse_mlp_smoothing") else []
    head = getattr(model, "lm_head", None) if lm_head else None
    if head is not None and not isinstance(head, LogitsHead):
        raise ValueError(f"{type(model).__name__} has no LogitsHead to quantize")
    observed = [p.linear for p in pairs] + [m.block.gate for m in sparse] + ([head] if head is not None else [])
    stats = collect_input_stats(observed, run_calibration) if observed else {}
    if pairs:
        smooth(pairs, stats, alpha)
    for m in sparse:  # (the router reads what the experts read: its input's statistics are theirs)
        smooth_sparse_mlp(m, stats[id(m.block.gate)], alpha)
    del sparse
    # the pairs hold views of float weights (up rows, v rows): dropped before the loop below, so
    # each gate_up and qkv float weight is freed as soon as its int8 copy exists rather than at
    # the end
    del pairs
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    for module in tqdm(linears, desc="quantizing", unit="linear", disable=None, leave=False):
        module.method = make_method()
        module.method.process_weights_after_loading(module)
    # MoE experts: int8 per output channel of each expert (smoothed above; the router stays float)
    for module in model.modules():
        if isinstance(module, StackedExperts):
            module.quantize_w8a8()
    if head is not None:
        head_stats = stats.get(id(head))
        head.quantize_int8(head_stats.absmax if head_stats else None, 0.5 if alpha is None else alpha)


def release_free_heap() -> None:
    """Returns the allocator's free pages to the OS (glibc ``malloc_trim``; elsewhere a no-op).

    Online quantization frees the float weights and many same-sized temporaries; glibc keeps
    such memory in its arenas (its mmap threshold rises to the largest freed block), which
    measured as ~350 MB of extra resident memory for SmolLM2-135M (RSS above the bf16 model's)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        trim = getattr(libc, "malloc_trim", None)
    except OSError:
        return
    if trim is not None:
        trim(0)
