"""anycore: an LLM serving engine for CPUs (x86-64 and Arm64)."""

import os

# MKL (torch's fp32 GEMM on x86) keeps the packing buffers of its largest GEMMs cached for the
# life of the process: after online W8A8 quantization (the smoothing search's fp32 matmuls) that
# was 23 MB of SmolLM2-135M's 477 MB RSS (heaptrack: mkl_serv_allocate from sgemm). Without the
# cache MKL frees them after each call. MKL reads this once, at its first allocation, so it is set
# before torch is imported; set MKL_DISABLE_FAST_MM=0 to keep MKL's default.
os.environ.setdefault("MKL_DISABLE_FAST_MM", "1")

from anycore.engine.grammar import StructuredOutput  # noqa: E402
from anycore.llm import LLM  # noqa: E402
from anycore.outputs import CompletionOutput, RequestOutput  # noqa: E402
from anycore.sampling_params import SamplingParams  # noqa: E402

__all__ = ["LLM", "SamplingParams", "StructuredOutput", "RequestOutput", "CompletionOutput"]
__version__ = "0.1.0"
