"""The engines `anycore bench compare` measures side by side: anycore in-process, llama.cpp
(llama-cpp-python), transformers, and the servers (anycore's own, llama.cpp's ``llama-server``).

A peer whose package is missing or that fails to start raises ``PeerUnavailable``; the harness
reports it as skipped and the other engines still run.
"""
