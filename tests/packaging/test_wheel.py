"""A wheel built from the sdist carries compiled kernels and serves on them without a compiler.

As a user would: the sdist is built from this checkout, a wheel from the sdist (so a file the
sdist forgets, such as a C++ source, fails the compile), the wheel is installed into a fresh
virtual environment, and `anycore doctor` / `anycore generate` run from outside the checkout
with no compiler reachable (PATH holds only the venv, CXX=/bin/false) and an empty home (no JIT
cache to fall back on). The wheel is built with --no-build-isolation against the torch running
this test, the way `make install` builds it. Its kernels come from the build's compile step,
which by design reuses a JIT-cache entry of the same hash (same sources, flags and torch; on a
cold cache it compiles them here): the hash is computed from the unpacked sdist's sources, so a
source the sdist lacked would change it and fail the compile. The venv sees this interpreter's site-packages for
torch and the other dependencies (nothing is downloaded); anycore itself comes from the wheel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import torch

from anycore.kernels import build

REPO = Path(__file__).resolve().parents[2]
LIB = "anycore/_native/libanycore_kernels.so"
INFO = "anycore/_native/build_info.json"


def _run(cmd: list[str], timeout: int, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("wheel")
    dist = tmp / "dist"
    sdist = _run([sys.executable, "-c", f"from setuptools import build_meta; print(build_meta.build_sdist({str(dist)!r}))"],
                 timeout=300, cwd=REPO).stdout.strip().splitlines()[-1]
    env = {k: v for k, v in os.environ.items() if k != "ANYCORE_EXT_DIR"}
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist),
          str(dist / sdist)], timeout=900, env=env, cwd=tmp)
    wheel = next(dist.glob("anycore-*.whl"))
    env_dir = tmp / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=False, symlinks=True)
    python = env_dir / "bin" / "python"
    # --ignore-installed: the venv sees this interpreter's anycore (often an editable checkout)
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--ignore-installed",
          str(wheel)], timeout=300)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     timeout=60).stdout.strip())
    home = tmp / "home"
    home.mkdir()
    return {"sdist": dist / sdist, "wheel": wheel, "venv": env_dir, "site": site, "home": home, "tmp": tmp}


def _no_compiler_env(paths: dict[str, Path]) -> dict[str, str]:
    return {"HOME": str(paths["home"]), "PATH": str(paths["venv"] / "bin"), "CXX": "/bin/false", "LANG": "C.UTF-8"}


@pytest.mark.slow
def test_sdist_and_wheel_carry_sources_and_the_library(installed):
    import tarfile

    with tarfile.open(installed["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"csrc/common/ops.cpp", "setup.py", "tests/data/SOURCE.md"} <= names
    with zipfile.ZipFile(installed["wheel"]) as whl:
        names = set(whl.namelist())
        meta = json.loads(whl.read(INFO))
    assert {LIB, INFO, "anycore/_csrc/common/ops.cpp", "anycore/_csrc/generic/generic.cpp"} <= names
    assert {f"anycore/server/static/{f}" for f in ("index.html", "app.js", "style.css")} <= names  # the web page
    assert meta["torch_version"] == torch.__version__
    target = build.native_target()
    assert meta["hash"] == build._source_hash(target, build._variants(target, None))  # this checkout's sources
    assert "generic" in meta["variants"] and len(meta["variants"]) > 1  # the ISA variants too
    assert not any("-march=native" in f for flags in meta["flags"].values() for f in flags)
    assert installed["wheel"].name.endswith(("linux_x86_64.whl", "linux_aarch64.whl"))  # not a pure wheel


def _kernel_table(report: str) -> dict[str, str]:
    """op -> implementation, from the doctor's kernel table."""
    lines = report.split("\nkernels   ", 1)[1].split("\nthreads", 1)[0].splitlines()[1:]
    return {ln.split()[0]: ln.split()[1] for ln in lines if ln.strip()}


@pytest.mark.slow
def test_installed_wheel_serves_native_kernels_without_a_compiler(installed):
    from anycore.doctor import run_doctor

    anycore = str(installed["venv"] / "bin" / "anycore")
    env = _no_compiler_env(installed)
    report = _run([anycore, "doctor"], timeout=300, env=env, cwd=installed["tmp"]).stdout
    lib = installed["site"] / LIB
    assert f"extension prebuilt in the wheel ({lib})" in report, report
    # the same choices as this checkout's own (JIT-built) extension makes on this CPU
    table = _kernel_table(report)
    assert table == _kernel_table(run_doctor(overrides="")), report
    assert table["decoder_stack"] == "native" and any(impl != "torch-native" for impl in table.values())
    gen = _run([anycore, "generate", "--prompt", "The capital of France is", "--max-tokens", "4"],
               timeout=600, env=env, cwd=installed["tmp"])
    kernels = next(ln for ln in gen.stderr.splitlines() if "kernels: rms_norm=" in ln)  # the engine's start-up line
    from anycore.kernels.ops import OP_NAMES  # (the table's other rows explain paths, they name no op)

    assert all(f"{op}={impl}" in kernels for op, impl in table.items() if op in OP_NAMES), kernels
    assert gen.stdout.strip()
    assert not (installed["home"] / ".cache" / "anycore" / "ext").exists(), "nothing was compiled at run time"


@pytest.mark.slow
def test_a_wheel_built_for_another_torch_says_so_and_does_not_load(installed):
    """The library of a wheel whose torch differs is never loaded (its C++ symbols may not match):
    the shipped sources would be compiled instead, and here, with no compiler, every op runs
    torch-native, with both facts in the warnings."""
    info = installed["site"] / INFO
    original = info.read_text()
    meta = json.loads(original)
    info.write_text(json.dumps({**meta, "torch_version": "2.0.0", "hash": "0" * 16}))
    try:
        env = _no_compiler_env(installed)
        proc = _run([str(installed["venv"] / "bin" / "anycore"), "doctor"], timeout=300, env=env, cwd=installed["tmp"])
    finally:
        info.write_text(original)
    report = proc.stdout
    assert f"built against torch 2.0.0, this process runs torch {torch.__version__}" in report, report
    assert "extension unavailable (" in report
    assert "every op runs torch-native" in report
