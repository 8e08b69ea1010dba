"""What the native decoder stack and the batch-1 decode team can run on this host.

Both compose the host's native kernels. A W8A8 projection needs the variant's own
``w8a8_linear``, a sparse MLP its ``fused_moe`` (``fused_moe_w8a8``), and the decode team a
native dense GEMV (``linear``); a dense projection of the stack may run oneDNN. An x86-64 CPU
without AVX-512 (AVX2 only: Zen 2/3, client Intel) has none of those ops natively, so there the
executor rightly runs such models op by op. Tests of the native paths skip exactly then, naming
what is missing, and still check the native paths wherever the kernels exist.
"""

from __future__ import annotations

import pytest


def stack_ops(quantization: str | None, moe: bool = False) -> list[str]:
    """The native ops the decoder stack needs for a model of that kind."""
    ops = ["w8a8_linear"] if quantization == "w8a8_int8" else []
    if moe:
        ops.append("fused_moe_w8a8" if quantization == "w8a8_int8" else "fused_moe")
    return ops


def team_ops(quantization: str | None) -> list[str]:
    """The native ops the batch-1 decode team needs (its dense GEMV or the W8A8 one)."""
    return ["w8a8_linear"] if quantization == "w8a8_int8" else ["linear"]


def missing(engine, ops: list[str]) -> list[str]:
    """Those of ``ops`` that the engine's kernel table holds no native variant of."""
    return [op for op in ops if op not in engine.ops.native_index]


def skip_unless_native(engine, ops: list[str], what: str) -> None:
    lacking = missing(engine, ops)
    if lacking:
        pytest.skip(f"{what} needs native {', '.join(lacking)}; this host runs them torch-native")
