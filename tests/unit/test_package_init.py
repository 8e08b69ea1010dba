"""Importing anycore turns MKL's GEMM buffer cache off unless the user chose otherwise.

MKL kept 23 MB of packing buffers after online W8A8 quantization of SmolLM2-135M (heaptrack);
with MKL_DISABLE_FAST_MM=1 the engine's RSS after load was 13-16 MB lower (see anycore/__init__.py).
MKL reads the variable once, at its first allocation, so the package sets it on import.
"""

from __future__ import annotations

import os
import subprocess
import sys

_CHILD = "import os, anycore; print(os.environ.get('MKL_DISABLE_FAST_MM'))"


def _after_import(extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k != "MKL_DISABLE_FAST_MM"}
    out = subprocess.run([sys.executable, "-c", _CHILD], env={**env, **extra}, capture_output=True, text=True,
                         timeout=120, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_import_disables_mkl_buffer_cache():
    assert _after_import({}) == "1"


def test_a_users_setting_wins():
    assert _after_import({"MKL_DISABLE_FAST_MM": "0"}) == "0"
