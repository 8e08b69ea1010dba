"""Builds the C++ kernel extension: a TORCH_LIBRARY op library (no Python bindings).

Native (what ``anycore.kernels.dispatch`` does at start-up)::

    info = load_extension()        # compiles once, then loads from the cache
    info.available, info.variants, info.error

Where the library comes from, first match wins:

1. ``$ANYCORE_EXT_DIR`` if set (a directory the user chose, e.g. the Arm64 lane's cross build);
2. the prebuilt library of an installed wheel (``anycore/_native/``, compiled by ``setup.py``
   with this same recipe; see ``anycore.kernels.prebuilt``), when its hash matches: the same
   sources, flags, architecture and torch version. A wheel built against another torch is
   skipped with a warning and the JIT path below compiles its shipped sources instead;
3. the JIT cache ``~/.cache/anycore/ext/<hash>``, compiled on first use (editable and
   development installs; also what ``setup.py`` reuses when it finds the same hash there).

The hash covers the sources (by their path under ``csrc/``, so every checkout and an installed
wheel agree), the per-file flags, the target architecture and the torch version. Only the host
architecture's translation units are compiled (plus common/ and generic/), each ISA variant
with its own flags as declared in ``anycore.platform.selection``; no ``-march=native``.
``torch.utils.cpp_extension.load`` cannot give one file its own flags, so this module runs the
compiler itself (``$CXX`` or g++, ``$ANYCORE_BUILD_JOBS`` parallel jobs, default 2). Any
failure is reported in ``info.error`` and a warning, never raised: the engine then runs on
torch-native ops.

Cross-compiling for aarch64 (the Arm64 emulation lane)::

    python -m anycore.kernels.build --cross aarch64 \\
        --torch-dir /lane/site/torch --out /lane/ext [--cxx aarch64-linux-gnu-g++] [--cxx11-abi 1]

``--torch-dir`` is the target wheel's ``torch`` package directory (with ``include/`` and
``lib/``). The output directory gets ``libanycore_kernels.so`` and ``build_info.json``; under
emulation set ``ANYCORE_EXT_DIR`` to it and ``load_extension()`` loads it without compiling
(its hash matches when the sources and that torch version match).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import fcntl
import glob
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from anycore.platform.features import normalize_arch
from anycore.platform.selection import Variant, buildable_variants

log = logging.getLogger("anycore.kernels")


def _find_csrc() -> Path:
    """The sources shipped inside an installed wheel, else the checkout's (editable or dev)."""
    package = Path(__file__).resolve().parents[1]
    shipped = package / "_csrc"
    return shipped if (shipped / "common").is_dir() else package.parent / "csrc"


CSRC = _find_csrc()
LIB_NAME = "libanycore_kernels.so"
INFO_NAME = "build_info.json"
_BUILD_FORMAT = 1  # bump when the build recipe changes in a way the hash would not see
_COMMON_FLAGS = ("-std=c++17", "-O3", "-fPIC", "-fopenmp", "-DNDEBUG", "-fno-math-errno", "-fno-trapping-math", "-Wall", "-Wno-maybe-uninitialized",
                 "-Wno-unknown-pragmas", "-fvisibility=hidden")


# The torch-facing units (op registration, the fused decoder), compiled for the baseline ISA: every
# .cpp of common/, so a new one is picked up without an edit here. ISA variants come from selection.
TORCH_UNITS = tuple(sorted(p.relative_to(CSRC).as_posix() for p in (CSRC / "common").glob("*.cpp")))


@dataclass(frozen=True)
class BuildTarget:
    arch: str
    torch_include: tuple[str, ...]
    torch_lib: str
    torch_version: str
    cxx11_abi: int
    cxx: str


@dataclass
class ExtensionInfo:
    available: bool
    path: str = ""
    variants: tuple[str, ...] = ()
    error: str = ""
    build_dir: str = ""
    cached: bool = False
    build_seconds: float = 0.0
    compiler: str = ""
    arch: str = ""
    flags: dict[str, list[str]] = field(default_factory=dict)
    origin: str = ""  # 'prebuilt' (the wheel's), 'jit' (compiled on this machine), 'ext-dir' ($ANYCORE_EXT_DIR)
    notes: tuple[str, ...] = ()  # why a prebuilt library was passed over, for `anycore doctor`


def native_target() -> BuildTarget:
    import torch
    from torch.utils import cpp_extension

    return BuildTarget(
        arch=normalize_arch(platform.machine()),
        torch_include=tuple(cpp_extension.include_paths()),
        torch_lib=os.path.join(os.path.dirname(torch.__file__), "lib"),
        torch_version=torch.__version__,
        cxx11_abi=int(torch._C._GLIBCXX_USE_CXX11_ABI),
        cxx=os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or "g++",
    )


def cross_target(arch: str, torch_dir: str, cxx: str | None, cxx11_abi: int = 1) -> BuildTarget:
    torch_dir = os.path.abspath(torch_dir)
    inc = os.path.join(torch_dir, "include")
    version = "unknown"
    version_py = os.path.join(torch_dir, "version.py")
    if os.path.exists(version_py):
        for line in Path(version_py).read_text().splitlines():
            if line.startswith("__version__"):
                version = line.split("=", 1)[1].strip().strip("'\"")
    return BuildTarget(
        arch=normalize_arch(arch),
        torch_include=(inc, os.path.join(inc, "torch", "csrc", "api", "include")),
        torch_lib=os.path.join(torch_dir, "lib"),
        torch_version=version,
        cxx11_abi=cxx11_abi,
        cxx=cxx or f"{normalize_arch(arch)}-linux-gnu-g++",
    )


def _variants(target: BuildTarget, only: tuple[str, ...] | None) -> tuple[Variant, ...]:
    vs = buildable_variants(target.arch)
    if only:
        vs = tuple(v for v in vs if v.name in only or v.name == "generic")
    return tuple(sorted(vs, key=lambda v: v.name != "generic"))  # generic first: the fallback table


def _source_hash(target: BuildTarget, variants: tuple[Variant, ...]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([_BUILD_FORMAT, target.arch, target.torch_version, target.cxx11_abi,
                         _COMMON_FLAGS, [(v.name, v.source, v.cflags) for v in variants]]).encode())
    subdirs = ["common", "generic", {"x86_64": "x86", "aarch64": "aarch64"}.get(target.arch, "generic")]
    for sub in subdirs:
        for f in sorted((CSRC / sub).glob("*")):
            h.update(f.relative_to(CSRC).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _default_dir(digest: str) -> Path:
    env = os.environ.get("ANYCORE_EXT_DIR")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "anycore" / "ext" / digest


def _openmp_link(target: BuildTarget) -> list[str]:
    """Link the OpenMP runtime torch ships (same soname, so one runtime per process)."""
    libs = Path(target.torch_lib).parent.parent / "torch.libs"  # where auditwheel puts it (aarch64)
    bundled = sorted(glob.glob(os.path.join(target.torch_lib, "libgomp*.so*")))
    bundled += sorted(glob.glob(str(libs / "libgomp*.so*")))
    return [bundled[0], "-lpthread"] if bundled else ["-fopenmp"]


def build(target: BuildTarget, out_dir: Path, only: tuple[str, ...] | None = None,
          jobs: int | None = None) -> ExtensionInfo:
    """Compiles into ``out_dir``; raises on failure (load_extension() turns that into a warning)."""
    variants = _variants(target, only)
    digest = _source_hash(target, variants)
    _check_compiler(target)
    out_dir.mkdir(parents=True, exist_ok=True)
    obj_dir = out_dir / "obj"
    obj_dir.mkdir(exist_ok=True)
    (obj_dir / "anycore_variants.inc").write_text(
        "".join(f"ANYCORE_VARIANT({v.name})\n" for v in variants))
    base = [*_COMMON_FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={target.cxx11_abi}"]
    torch_flags = [*base, f"-I{obj_dir}", *(f"-I{p}" for p in target.torch_include)]
    # the torch-facing units, compiled for the baseline ISA; the variants follow, one per ISA level
    units: list[tuple[str, list[str]]] = [(src, torch_flags) for src in TORCH_UNITS]
    units += [(v.source, [*base, *v.cflags]) for v in variants]
    t0 = time.monotonic()

    def compile_one(unit: tuple[str, list[str]]) -> str:
        src, flags = unit
        obj = obj_dir / (src.replace("/", "_").removesuffix(".cpp") + ".o")
        cmd = [target.cxx, *flags, "-c", str(CSRC / src), "-o", str(obj)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"compiling {src} failed:\n{' '.join(cmd)}\n{proc.stderr[-4000:]}")
        return str(obj)

    jobs = jobs or int(os.environ.get("ANYCORE_BUILD_JOBS", "2"))
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        objs = list(pool.map(compile_one, units))
    lib = out_dir / LIB_NAME
    tmp = out_dir / (LIB_NAME + f".tmp{os.getpid()}")
    cmd = [target.cxx, "-shared", "-o", str(tmp), *objs, f"-L{target.torch_lib}", "-lc10", "-ltorch_cpu",
           *_openmp_link(target)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"linking failed:\n{' '.join(cmd)}\n{proc.stderr[-4000:]}")
    os.replace(tmp, lib)  # atomic: a concurrent loader never sees a half-written library
    info = ExtensionInfo(
        available=False, path=str(lib), variants=tuple(v.name for v in variants), build_dir=str(out_dir),
        build_seconds=round(time.monotonic() - t0, 1), compiler=_compiler_version(target.cxx),
        arch=target.arch, flags={src: flags for src, flags in units},
    )
    meta = dataclasses.asdict(info) | {"hash": digest, "torch_version": target.torch_version,
                                       "cxx11_abi": target.cxx11_abi}
    (out_dir / INFO_NAME).write_text(json.dumps(meta, indent=1))
    return info


def _check_compiler(target: BuildTarget) -> None:
    """Refuses a compiler for another architecture (e.g. the host's g++ seen from under QEMU)."""
    try:
        proc = subprocess.run([target.cxx, "-dumpmachine"], capture_output=True, text=True)
    except OSError as e:
        raise RuntimeError(f"no C++ compiler {target.cxx!r}: {e}") from e
    if proc.returncode != 0:
        raise RuntimeError(f"C++ compiler {target.cxx!r} does not work ({target.cxx} -dumpmachine exited "
                           f"{proc.returncode})")
    machine = normalize_arch(proc.stdout.strip().split("-")[0])
    if machine != target.arch:
        raise RuntimeError(f"{target.cxx} targets {proc.stdout.strip() or '?'}, not {target.arch}")


def _compiler_version(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        return cxx


def _read_info(out_dir: Path) -> dict | None:
    try:
        meta = json.loads((out_dir / INFO_NAME).read_text())
    except (OSError, ValueError):
        return None
    return meta if (out_dir / LIB_NAME).exists() else None


@lru_cache(maxsize=1)
def load_extension() -> ExtensionInfo:
    """Builds (first time) and loads the host extension once per process; never raises."""
    try:
        return _load()
    except Exception as e:  # noqa: BLE001 - any failure degrades to torch-native, by design
        return _unavailable(e)


def _unavailable(e: Exception, notes: tuple[str, ...] = ()) -> ExtensionInfo:
    msg = f"{type(e).__name__}: {e}".strip()
    warnings.warn(f"anycore kernel extension unavailable, using torch-native ops ({msg[:2000]})",
                  RuntimeWarning, stacklevel=3)
    log.warning("kernel extension unavailable: %s", msg)
    return ExtensionInfo(available=False, error=msg.splitlines()[0][:300] if msg else "error", notes=notes)


def ensure_built(target: BuildTarget, out_dir: Path, digest: str) -> tuple[dict, bool]:
    """The build metadata in ``out_dir``, compiling first unless a build with ``digest`` is there.

    Returns ``(meta, cached)``. One builder per directory (a file lock); the others wait, then
    reuse its result. Shared by the JIT path and ``setup.py``, so both compile the same way."""
    meta = _read_info(out_dir)
    if meta is not None and meta.get("hash") == digest:
        return meta, True
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        meta = _read_info(out_dir)
        if meta is None or meta.get("hash") != digest:
            log.info("building anycore kernel extension in %s", out_dir)
            build(target, out_dir)
            meta = _read_info(out_dir)
    assert meta is not None
    return meta, False


def _load() -> ExtensionInfo:
    import torch

    from anycore.kernels import prebuilt

    if os.environ.get("ANYCORE_NO_EXT"):
        return ExtensionInfo(available=False, error="disabled by ANYCORE_NO_EXT")
    target = native_target()
    digest = _source_hash(target, _variants(target, None))
    notes: tuple[str, ...] = ()
    if not os.environ.get("ANYCORE_EXT_DIR"):
        found = prebuilt.find(digest, target)
        if found.meta is not None:
            return _open(torch, found.directory, found.meta, origin="prebuilt", cached=True)
        if found.problem:  # a wheel whose kernels do not fit this torch: say so, then compile
            warnings.warn(f"anycore: {found.problem}", RuntimeWarning, stacklevel=3)
            log.warning("%s", found.problem)
            notes = (found.problem,)
    out_dir = _default_dir(digest)
    try:
        meta, cached = ensure_built(target, out_dir, digest)
    except Exception as e:  # noqa: BLE001 - as in load_extension, keeping why the prebuilt was passed over
        if not notes:
            raise
        return _unavailable(e, notes)
    origin = "ext-dir" if os.environ.get("ANYCORE_EXT_DIR") else "jit"
    return dataclasses.replace(_open(torch, out_dir, meta, origin=origin, cached=cached), notes=notes)


def _open(torch, directory: Path, meta: dict, origin: str, cached: bool) -> ExtensionInfo:
    lib = str(directory / LIB_NAME)
    torch.ops.load_library(lib)
    return ExtensionInfo(
        available=True, path=lib, variants=tuple(torch.ops.anycore.variants()), build_dir=str(directory),
        cached=cached, build_seconds=meta.get("build_seconds", 0.0), compiler=meta.get("compiler", ""),
        arch=meta.get("arch", ""), flags=meta.get("flags", {}), origin=origin,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m anycore.kernels.build", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cross", metavar="ARCH", help="target architecture (e.g. aarch64)")
    p.add_argument("--torch-dir", help="target torch package dir (with include/ and lib/); cross only")
    p.add_argument("--cxx", help="compiler (default: $CXX or g++; cross: ARCH-linux-gnu-g++)")
    p.add_argument("--cxx11-abi", type=int, default=1, help="_GLIBCXX_USE_CXX11_ABI of the target torch")
    p.add_argument("--out", help="output directory (default: the native cache directory)")
    p.add_argument("--variants", help="comma list of variants to build (generic always included)")
    p.add_argument("-j", "--jobs", type=int, default=None)
    a = p.parse_args(argv)
    if a.cross:
        if not a.torch_dir or not a.out:
            p.error("--cross needs --torch-dir and --out")
        target = cross_target(a.cross, a.torch_dir, a.cxx, a.cxx11_abi)
    else:
        target = native_target()
        if a.cxx:
            target = dataclasses.replace(target, cxx=a.cxx)
    only = tuple(a.variants.split(",")) if a.variants else None
    out = Path(a.out) if a.out else _default_dir(_source_hash(target, _variants(target, only)))
    try:
        info = build(target, out, only, a.jobs)
    except (RuntimeError, OSError) as e:
        print(e, file=sys.stderr)
        return 1
    print(f"built {info.path} ({target.arch}; variants: {', '.join(info.variants)}; {info.build_seconds}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
