"""The kernel library a wheel ships: staged when the package is built, checked before it is loaded.

``setup.py`` calls ``stage()`` while building a wheel: it compiles the host extension with the
same recipe and cache as the JIT path (``anycore.kernels.build.ensure_built``; a cache entry
with the same hash is reused rather than compiled again), then copies into the package

    anycore/_native/libanycore_kernels.so   the library
    anycore/_native/build_info.json         its hash, torch version, compiler, variants, flags
    anycore/_csrc/                          the sources it was compiled from (the JIT fallback)

At run time ``find()`` accepts the library only when its recorded hash equals the one computed
here from the shipped sources and the running torch: the hash covers the torch version, the
C++ ABI, the architecture and the flags, so a library built against another torch (whose C++
symbols may differ: loading it could crash the process) is never loaded. It is passed over
with a stated reason, and the caller compiles the shipped sources instead (or, without a
compiler, runs torch-native with a warning).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from anycore.kernels import build

PACKAGE = Path(__file__).resolve().parents[1]
NATIVE_DIR = PACKAGE / "_native"


@dataclass(frozen=True)
class Prebuilt:
    directory: Path
    meta: dict | None  # the build metadata when the library fits this process, else None
    problem: str = ""  # why a library that is present does not fit ('' when absent or fitting)


def find(digest: str, target: build.BuildTarget, directory: Path | None = None) -> Prebuilt:
    """The prebuilt library in ``directory`` (default: this package's) if it was built for ``digest``."""
    directory = directory or NATIVE_DIR
    lib, info = directory / build.LIB_NAME, directory / build.INFO_NAME
    if not lib.exists():
        return Prebuilt(directory, None)
    try:
        meta = json.loads(info.read_text())
    except (OSError, ValueError) as e:
        return Prebuilt(directory, None, f"prebuilt kernels in {directory} have no readable {build.INFO_NAME} "
                                         f"({e}); compiling the shipped sources instead")
    if meta.get("hash") == digest:
        return Prebuilt(directory, meta)
    return Prebuilt(directory, None, _mismatch(meta, target, directory))


def _mismatch(meta: dict, target: build.BuildTarget, directory: Path) -> str:
    built, running = meta.get("torch_version", "?"), target.torch_version
    if built != running:
        why = f"were built against torch {built}, this process runs torch {running}"
    elif meta.get("arch") != target.arch:
        why = f"were built for {meta.get('arch')}, this machine is {target.arch}"
    elif meta.get("cxx11_abi", target.cxx11_abi) != target.cxx11_abi:
        why = f"use _GLIBCXX_USE_CXX11_ABI={meta.get('cxx11_abi')}, this torch {target.cxx11_abi}"
    else:
        why = "do not match the shipped sources or build recipe"
    return (f"prebuilt kernels in {directory} {why} (hash {meta.get('hash')} != {_digest_of(target)}); "
            "compiling the shipped sources instead (needs a C++ compiler; without one every op runs "
            "torch-native, several times slower); reinstall anycore built against this torch to avoid it")


def _digest_of(target: build.BuildTarget) -> str:
    return build._source_hash(target, build._variants(target, None))


def stage(package_dir: Path, target: build.BuildTarget | None = None) -> dict:
    """Compiles (or reuses the JIT cache entry with the same hash) and copies the library, its
    metadata and the sources into ``package_dir`` (the ``anycore`` folder being packaged).
    Raises on a failed compile: a wheel without its kernels would run several times slower."""
    target = target or build.native_target()
    digest = _digest_of(target)
    try:
        cache = build._default_dir(digest)
        meta, cached = build.ensure_built(target, cache, digest)
    except OSError:  # a build sandbox without a writable home: compile in a scratch folder
        cache = Path(tempfile.mkdtemp(prefix="anycore-kernels-"))
        meta, cached = build.ensure_built(target, cache, digest)
    native = package_dir / "_native"
    if native.exists():
        shutil.rmtree(native)
    native.mkdir(parents=True)
    shutil.copy2(cache / build.LIB_NAME, native / build.LIB_NAME)
    meta = {**meta, "path": "", "build_dir": "", "reused_jit_cache": cached}
    (native / build.INFO_NAME).write_text(json.dumps(meta, indent=1))
    sources = package_dir / "_csrc"
    if sources.exists():
        shutil.rmtree(sources)
    shutil.copytree(build.CSRC, sources, ignore=shutil.ignore_patterns("*.o", "*.so", "__pycache__"))
    return meta
