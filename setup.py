"""Builds anycore with its C++ kernels compiled in, as the serving engines users know do.

``pip wheel .`` / ``pip install .`` compile the kernel extension while the package is built,
with the recipe of ``anycore.kernels.build`` (each ISA variant its own translation unit and
flags, runtime dispatch unchanged), against the torch of the build environment, and ship the
library with the torch version it was built against (``anycore/_native/``) plus the sources
(``anycore/_csrc/``). The installed package then needs no compiler; a different torch at run
time is detected and the shipped sources are compiled instead (``anycore.kernels.prebuilt``).

Editable installs (``pip install -e .``) compile nothing here: the checkout's csrc/ is
compiled on first use and cached (the JIT path), so kernel edits take effect on the next run.

``ANYCORE_SKIP_KERNEL_BUILD=1`` builds a wheel without the library (it then compiles on first
use, or runs torch-native without a compiler); a failed compile otherwise fails the build.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _skip_kernels() -> bool:
    return os.environ.get("ANYCORE_SKIP_KERNEL_BUILD", "") not in ("", "0")


def _kernel_staging():
    """``anycore.kernels.prebuilt`` without running ``anycore/__init__.py``: that imports the
    engine and its dependencies, which a build environment (setuptools + torch) lacks. The
    kernel recipe itself needs only the standard library and torch."""
    for name in ("anycore", "anycore.platform", "anycore.kernels"):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(ROOT.joinpath(*name.split(".")))]
            sys.modules[name] = package
    return importlib.import_module("anycore.kernels.prebuilt")


class BuildKernels(build_ext):
    """Compiles the kernel library into the package being built (not a Python extension module:
    a TORCH_LIBRARY op library that ``torch.ops.load_library`` opens)."""

    def run(self) -> None:
        if getattr(self, "editable_mode", False) or self.inplace:
            print("anycore: editable install, kernels compile on first use (JIT cache)")
            return
        if _skip_kernels():
            print("anycore: ANYCORE_SKIP_KERNEL_BUILD set, the wheel ships no kernel library")
            return
        staging = _kernel_staging()
        meta = staging.stage(Path(self.build_lib) / "anycore")
        how = "reused from the JIT cache" if meta["reused_jit_cache"] else f"compiled in {meta['build_seconds']}s"
        print(f"anycore: kernels for torch {meta['torch_version']} ({meta['arch']}: "
              f"{', '.join(meta['variants'])}) {how}")

    def get_outputs(self) -> list[str]:
        return []  # install_lib copies the whole build folder, _native/ and _csrc/ included


class KernelDistribution(Distribution):
    """Not pure: the wheel carries a compiled library, so it is tagged for one platform."""

    def has_ext_modules(self) -> bool:
        return not _skip_kernels()


setup(distclass=KernelDistribution, cmdclass={"build_ext": BuildKernels})
