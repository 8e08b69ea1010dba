"""anycore: an LLM serving engine for CPUs (x86-64 and Arm64)."""

from anycore.llm import LLM
from anycore.outputs import CompletionOutput, RequestOutput
from anycore.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
__version__ = "0.1.0"
