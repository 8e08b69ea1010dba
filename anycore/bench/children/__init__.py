"""Programs `anycore bench` runs in a child process, started by file path (``run_child``), their
one argument a JSON object (so no argument is spliced into code).

They are run as files, not with ``python -m anycore.bench...``: ``-m`` would import the anycore
package (and torch with it) before the program starts, and the child that measures llama.cpp's
resident memory must not carry anycore's. So each imports only the standard library at module
level and its subject (anycore's engine, llama_cpp) inside the function that measures it; they
stay importable, so tests call their functions directly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

CHILDREN = Path(__file__).resolve().parent
# the import root of the anycore package this process runs, so the child measures the same code
# (an editable install may point elsewhere than the working tree the parent was started from)
ANYCORE_ROOT = CHILDREN.parents[2]


def command(program: str, payload: dict[str, Any]) -> list[str]:
    path = CHILDREN / f"{program}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no child program {path}")
    return [sys.executable, str(path), json.dumps(payload)]


def child_env() -> dict[str, str]:
    paths = [str(ANYCORE_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def run_child(program: str, payload: dict[str, Any], timeout: float) -> subprocess.CompletedProcess[str]:
    """Runs the child to completion; raises ``subprocess.TimeoutExpired`` past ``timeout`` s."""
    return subprocess.run(command(program, payload), capture_output=True, text=True, timeout=timeout,
                          env=child_env())
