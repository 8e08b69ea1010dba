"""`anycore bench compare`: anycore against llama.cpp and transformers on the same model and prompts.

Workloads (``--workloads``): decode (batch-1, tok/s after a 16-token prompt), prefill (one 512-token
prompt), batch (offline, ``--batch-prompts`` prompts at once), memory (RSS after load and after a
short generation, each engine in a fresh process: anycore bf16, anycore ``--quantization``,
llama.cpp's ``--gguf-types``), serve (streaming HTTP at each ``--concurrency``: output tok/s, TTFT
p50, ITL p50), prefix (cold ~1000-token TTFT vs 16 requests sharing a ~1000-token prefix at
concurrency 4). Engines run interleaved (A B C A B C ...) for ``--repeats`` rounds; each cell
reports the median, the spread (CV), other processes' CPU use while it ran, its fraction of the
physical limit, anycore/peer ratios and a NOISY flag. A peer that is not installed or fails to
start is reported as skipped.

Layout: ``args`` (the flags, each checked before any work), ``context`` (what the phases share,
with the result that is written to JSON after every workload), one module per phase
(``offline_phase``, ``memory_phase``, ``serve_phase``) and ``run`` (limits, phases, output).
"""
