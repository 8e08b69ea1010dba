"""Resident memory of an engine, each measured in a fresh child process (`anycore bench compare`).

The child reads its own ``/proc/self/status`` at three points: after importing the engine's
package (the runtime's own share: torch, libraries), after loading the model (weights, KV pool,
quantization done), and after a short generation (a 16-token prompt, ``gen_tokens`` greedy
tokens: first-use allocations, KV pages written). ``VmRSS`` counts anonymous and file-backed
resident pages alike (llama.cpp maps its GGUF file; anycore copies weights into anonymous
memory), so engines compare on the same footing; ``VmHWM`` is the peak, which includes
transients such as the float weights held while an online quantization runs.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from anycore.bench.peers_offline import PeerUnavailable

_STATUS_HELPER = r"""
import json, sys
def _mem():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(rest.split()[0]) * 1024
    return out
"""

_ANYCORE_CHILD = _STATUS_HELPER + r"""
from anycore.config import EngineConfig
from anycore.engine.engine import Engine
from anycore.sampling_params import SamplingParams
import torch
report = {"import": _mem()}
cfg = EngineConfig(**json.loads(sys.argv[1]))
engine = Engine(cfg)
report["load"] = _mem()
report["weight_bytes"] = engine.weight_bytes
engine.add_request(list(range(1000, 1016)), SamplingParams(temperature=0, max_tokens=int(sys.argv[2]), ignore_eos=True))
while engine.has_unfinished():
    engine.step()
report["generate"] = _mem()
print("RSS-JSON " + json.dumps(report))
"""

_LLAMA_CHILD = _STATUS_HELPER + r"""
import llama_cpp
report = {"import": _mem()}
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=int(sys.argv[3]),
                      n_threads_batch=int(sys.argv[3]), verbose=False)
report["load"] = _mem()
llm.eval(list(range(1000, 1016)))
for _ in range(int(sys.argv[2])):
    llm.eval([1000])
report["generate"] = _mem()
print("RSS-JSON " + json.dumps(report))
"""


def _run_child(code: str, args: list[str], timeout: float) -> dict[str, Any]:
    try:
        r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise PeerUnavailable(f"memory probe timed out after {timeout:.0f}s") from None
    for line in r.stdout.splitlines():
        if line.startswith("RSS-JSON "):
            return json.loads(line[len("RSS-JSON "):])
    raise PeerUnavailable(f"memory probe failed (rc {r.returncode}): {r.stderr.strip()[-300:]}")


def anycore_rss(config: Any, gen_tokens: int = 32, timeout: float = 900.0) -> dict[str, Any]:
    """RSS of an anycore ``Engine(config)`` in a fresh process (see the module docstring)."""
    return _run_child(_ANYCORE_CHILD, [json.dumps(dataclasses.asdict(config)), str(gen_tokens)], timeout)


def llama_cpp_rss(gguf: Path, threads: int, gen_tokens: int = 32, timeout: float = 600.0) -> dict[str, Any]:
    """RSS of llama-cpp-python on ``gguf`` in a fresh process (same points and settings as the
    offline llama.cpp runner: n_ctx 2048, batch 512)."""
    return _run_child(_LLAMA_CHILD, [str(gguf), str(gen_tokens), str(threads)], timeout)
