"""Extension build plumbing: a failed build degrades to torch-native with a warning, never a crash."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from anycore.kernels import build, dispatch, reference
from anycore.kernels.build import ExtensionInfo
from anycore.platform.features import detect


def test_hash_covers_flags_and_arch():
    t = build.native_target()
    vs = build._variants(t, None)
    assert vs[0].name == "generic"
    h = build._source_hash(t, vs)
    assert h == build._source_hash(t, vs)
    assert h != build._source_hash(dataclasses.replace(t, arch="aarch64"), vs)
    assert h != build._source_hash(dataclasses.replace(t, torch_version="0.0"), vs)


def test_wrong_compiler_is_refused(tmp_path):
    t = dataclasses.replace(build.native_target(), cxx="/nonexistent/c++")
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        build.build(t, tmp_path)
    t = dataclasses.replace(build.native_target(), arch="aarch64" if detect().arch != "aarch64" else "x86_64")
    with pytest.raises(RuntimeError, match="targets"):
        build.build(t, tmp_path)


def test_load_failure_is_a_warning(monkeypatch):
    def boom():
        raise RuntimeError("compiler exploded")

    monkeypatch.setattr(build, "_load", boom)
    with pytest.warns(RuntimeWarning, match="compiler exploded"):
        info = build.load_extension.__wrapped__()
    assert not info.available and "compiler exploded" in info.error


@pytest.mark.arm64
def test_no_extension_means_torch_native_everywhere():
    ext = ExtensionInfo(available=False, error="simulated")
    ops = dispatch.select_ops(overrides="", extension=ext)
    assert set(ops.choices.values()) == {"torch-native"}
    assert all("simulated" in r or "no native variant" in r or "lacks" in r for r in ops.reasons.values())
    x, w = torch.randn(3, 64), torch.randn(64)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6))


def test_forcing_a_missing_variant_raises_not_sigill():
    with pytest.raises((RuntimeError, ValueError)):
        dispatch.native_op("rms_norm", "sve" if detect().arch != "aarch64" else "avx512")


def test_isa_objects_export_only_their_table():
    """An ISA unit must share no code with others: a weak (COMDAT) function compiled with AVX-512
    flags could be the copy the linker keeps for the baseline unit too, and SIGILL elsewhere."""
    import shutil
    import subprocess
    from pathlib import Path

    info = build.load_extension()
    nm = shutil.which("nm")
    if not info.available or nm is None:
        pytest.skip("needs the built extension and nm")
    baseline = {src.replace("/", "_").removesuffix(".cpp") + ".o" for src in build.TORCH_UNITS}
    objs = [o for o in sorted(Path(info.build_dir, "obj").glob("*.o")) if o.name not in baseline]
    assert objs
    for o in objs:
        out = subprocess.run([nm, "--defined-only", "-C", str(o)], capture_output=True, text=True).stdout
        exported = [ln.split(" ", 2)[2] for ln in out.splitlines()
                    if ln.split(" ")[1:2] and ln.split(" ")[1] in "TWVuDRB" and "DW.ref." not in ln]
        assert len(exported) == 1 and exported[0].startswith("anycore::kTable_"), (o.name, exported)


def test_isa_objects_run_no_code_at_load():
    """Each variant's table is constant-initialised (constexpr): an ISA object has no
    initialisers, so loading the library runs nothing compiled with that ISA's flags."""
    import shutil
    import subprocess
    from pathlib import Path

    info = build.load_extension()
    readelf = shutil.which("readelf")
    if not info.available or readelf is None:
        pytest.skip("needs the built extension and readelf")
    baseline = {src.replace("/", "_").removesuffix(".cpp") + ".o" for src in build.TORCH_UNITS}
    objs = [o for o in sorted(Path(info.build_dir, "obj").glob("*.o")) if o.name not in baseline]
    assert objs
    for o in objs:
        sections = subprocess.run([readelf, "-S", "-W", str(o)], capture_output=True, text=True).stdout
        assert ".init_array" not in sections and ".ctors" not in sections, o.name
