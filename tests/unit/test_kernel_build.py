"""Extension build plumbing: a failed build degrades to torch-native with a warning, never a crash;
a wheel's prebuilt library is used only when it fits this torch and these sources."""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from anycore.kernels import build, dispatch, prebuilt, reference
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


def test_hash_does_not_depend_on_where_the_sources_lie(tmp_path, monkeypatch):
    """A wheel checks its library against the hash of the sources it ships (anycore/_csrc), so the
    hash must be the same for a checkout and for the copy inside an installed package."""
    t = build.native_target()
    vs = build._variants(t, None)
    here = build._source_hash(t, vs)
    shutil.copytree(build.CSRC, tmp_path / "_csrc")
    monkeypatch.setattr(build, "CSRC", tmp_path / "_csrc")
    assert build._source_hash(t, vs) == here
    (tmp_path / "_csrc" / "common" / "ops.cpp").write_text("// edited\n", encoding="utf-8")
    assert build._source_hash(t, vs) != here


def test_every_common_unit_is_compiled():
    units = set(build.TORCH_UNITS)
    assert "common/ops.cpp" in units
    assert units == {p.relative_to(build.CSRC).as_posix() for p in (build.CSRC / "common").glob("*.cpp")}


def _staged(tmp_path) -> tuple[Path, dict, str]:
    """The package layout setup.py produces, from this checkout (reusing the JIT cache entry)."""
    t = build.native_target()
    meta = prebuilt.stage(tmp_path / "anycore", t)
    return tmp_path / "anycore" / "_native", meta, build._source_hash(t, build._variants(t, None))


def test_staged_wheel_layout_is_accepted_and_describes_its_build(tmp_path, monkeypatch):
    native, meta, digest = _staged(tmp_path)
    assert (native / build.LIB_NAME).stat().st_size > 0
    assert meta["hash"] == digest and meta["torch_version"] == torch.__version__ and "generic" in meta["variants"]
    assert prebuilt.find(digest, build.native_target(), native).meta == json.loads((native / build.INFO_NAME).read_text())
    # the shipped sources hash to the recorded value: an installed wheel recomputes it from them
    monkeypatch.setattr(build, "CSRC", tmp_path / "anycore" / "_csrc")
    assert build._source_hash(build.native_target(), build._variants(build.native_target(), None)) == digest


def test_prebuilt_for_another_torch_is_passed_over_with_the_reason(tmp_path):
    native, meta, digest = _staged(tmp_path)
    (native / build.INFO_NAME).write_text(json.dumps({**meta, "torch_version": "2.0.0", "hash": "f" * 16}))
    found = prebuilt.find(digest, build.native_target(), native)
    assert found.meta is None
    assert f"built against torch 2.0.0, this process runs torch {torch.__version__}" in found.problem
    assert prebuilt.find(digest, build.native_target(), tmp_path / "absent") == prebuilt.Prebuilt(tmp_path / "absent", None)


def test_load_skips_a_stale_prebuilt_and_says_so(tmp_path, monkeypatch):
    """The process loads the JIT-cache library instead (never the stale one) and reports why."""
    native, meta, _ = _staged(tmp_path)
    (native / build.INFO_NAME).write_text(json.dumps({**meta, "torch_version": "2.0.0", "hash": "f" * 16}))
    monkeypatch.setattr(prebuilt, "NATIVE_DIR", native)
    monkeypatch.delenv("ANYCORE_EXT_DIR", raising=False)
    monkeypatch.delenv("ANYCORE_NO_EXT", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        info = build._load()
    assert info.available and info.origin == "jit" and not info.path.startswith(str(native))
    assert any("built against torch 2.0.0" in str(w.message) for w in caught)
    assert info.notes and "built against torch 2.0.0" in info.notes[0]


def test_stale_prebuilt_without_a_compiler_means_torch_native_with_both_reasons(tmp_path, monkeypatch):
    native, meta, _ = _staged(tmp_path)
    (native / build.INFO_NAME).write_text(json.dumps({**meta, "torch_version": "2.0.0", "hash": "f" * 16}))
    monkeypatch.setattr(prebuilt, "NATIVE_DIR", native)
    monkeypatch.delenv("ANYCORE_EXT_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # an empty JIT cache
    monkeypatch.setenv("CXX", "/bin/false")
    with pytest.warns(RuntimeWarning) as caught:
        info = build._load()
    assert not info.available and "does not work" in info.error
    assert "built against torch 2.0.0" in info.notes[0]
    assert {"built against torch 2.0.0" in str(w.message) for w in caught} == {True, False}  # both warned


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
    import subprocess

    info = build.load_extension()
    nm = shutil.which("nm")
    if not info.available or nm is None or not Path(info.build_dir, "obj").is_dir():
        pytest.skip("needs the extension's objects (a local build, not a wheel's library) and nm")
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
