"""Benchmarks: serving (HTTP load against any OpenAI-compatible server), kernels, ..."""
