"""In the Arm64 lane, the cross-compiled extension is the one that runs.

The lane builds ``libanycore_kernels.so`` on the x86 host with the aarch64 cross compiler and
points ``ANYCORE_EXT_DIR`` at it. If the loader disagreed with that build (another source hash,
torch version or flag set) it would try to compile under emulation, fail, fall back to the
torch-native ops, and every Arm kernel test would skip: quiet, and wrong. This makes it loud.
"""

from __future__ import annotations

import os
import platform

import pytest

pytestmark = [
    pytest.mark.arm64,
    pytest.mark.skipif(
        not (os.environ.get("ANYCORE_ARM64_LANE") and os.environ.get("ANYCORE_EXT_DIR")),
        reason="only in the Arm64 lane with a cross-built extension",
    ),
]


def test_cross_built_extension_loads_as_is():
    from anycore.kernels.build import load_extension
    from anycore.platform.selection import buildable_variants

    info = load_extension()
    assert platform.machine() == "aarch64"
    assert info.available, f"extension did not load: {info.error}"
    assert info.cached, "the loader rebuilt instead of taking the lane's cross-built library"
    assert os.path.dirname(info.path) == os.path.normpath(os.environ["ANYCORE_EXT_DIR"])
    assert set(info.variants) == {v.name for v in buildable_variants("aarch64")}
