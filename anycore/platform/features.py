"""CPU feature detection, done once at start-up and passed around as a frozen value.

Flag names follow the Linux kernel's spelling in ``/proc/cpuinfo`` on both architectures
(x86: ``avx512f``, ``avx512_bf16``, ``amx_tile``; aarch64: ``asimd``, ``asimddp``, ``i8mm``,
``sve``), so a feature set can be written by hand in tests and compared with a real machine.
On aarch64 the cpuinfo ``Features`` line is merged with ``getauxval(AT_HWCAP/AT_HWCAP2)``
(cpuinfo may be hidden in containers; the auxv is what the kernel actually grants).

One kind of flag is not the kernel's: ``sve<bits>`` (``sve128``, ``sve256``, ...), a pseudo-flag
for the current SVE vector length, derived from ``sve_vector_bits``. It lets a variant compiled
for one fixed length (``-msve-vector-bits=256``: the ``sve256`` variant) require that length like
any other flag, so ``CpuFeatures.has``/``missing`` and the selection table need nothing special.
``CpuFeatures`` keeps it in step with ``sve_vector_bits`` (and the ``sve`` flag): a hand-written
``sve<bits>`` in ``flags`` is dropped unless the length matches. Real flags never collide with it
(``sve2`` is SVE2; lengths are multiples of 128).
"""

from __future__ import annotations

import ctypes
import glob
import os
import platform
import re
from dataclasses import dataclass, field

# AArch64 HWCAP bits (linux/arch/arm64/include/uapi/asm/hwcap.h), named as in /proc/cpuinfo.
_HWCAP_BITS = {
    0: "fp", 1: "asimd", 3: "aes", 4: "pmull", 5: "sha1", 6: "sha2", 7: "crc32", 8: "atomics",
    9: "fphp", 10: "asimdhp", 12: "asimdrdm", 13: "jscvt", 14: "fcma", 15: "lrcpc", 17: "sha3",
    20: "asimddp", 21: "sha512", 22: "sve", 23: "asimdfhm",
}
_HWCAP2_BITS = {
    1: "sve2", 9: "svei8mm", 10: "svef32mm", 11: "svef64mm", 12: "svebf16", 13: "i8mm", 14: "bf16",
    23: "sme", 37: "sme2",
}
_AT_HWCAP, _AT_HWCAP2 = 16, 26
_PR_SVE_GET_VL = 51
_PR_SVE_VL_LEN_MASK = 0xFFFF
_SVE_LENGTH_FLAG = re.compile(r"sve(\d+)")


def sve_length_flag(bits: int) -> str:
    """The pseudo-flag naming an SVE vector length, e.g. ``sve256``."""
    return f"sve{bits}"


def is_sve_length_flag(name: str) -> bool:
    m = _SVE_LENGTH_FLAG.fullmatch(name)
    return m is not None and int(m.group(1)) >= 128


def normalize_arch(machine: str) -> str:
    m = machine.lower()
    if m in ("x86_64", "amd64", "x64"):
        return "x86_64"
    if m in ("aarch64", "arm64", "armv8", "armv8l"):
        return "aarch64"
    return m or "unknown"


@dataclass(frozen=True)
class CpuFeatures:
    """What the CPU offers. Build by hand in tests; ``detect()`` on a real machine."""

    arch: str  # 'x86_64' | 'aarch64' | anything else (then only generic code runs)
    flags: frozenset[str] = frozenset()
    model_name: str = ""
    cores: int = 1  # logical CPUs this process may run on
    numa_nodes: int = 1
    # cache level/type -> bytes, e.g. (("L1d", 49152), ("L2", 2097152), ("L3", ...))
    caches: tuple[tuple[str, int], ...] = ()
    sve_vector_bits: int = 0  # 0 when SVE is absent or the length is unknown
    notes: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        # the sve<bits> pseudo-flag follows sve_vector_bits, whatever `flags` was given
        flags = frozenset(f for f in self.flags if not is_sve_length_flag(f))
        if self.sve_vector_bits > 0 and "sve" in flags:
            flags |= {sve_length_flag(self.sve_vector_bits)}
        object.__setattr__(self, "flags", flags)

    def has(self, *names: str) -> bool:
        return all(n in self.flags for n in names)

    def missing(self, names) -> list[str]:
        return sorted(n for n in names if n not in self.flags)

    def cache_bytes(self, name: str) -> int:
        return dict(self.caches).get(name, 0)


def detect() -> CpuFeatures:
    """Features of the machine this process runs on. Never raises; unknowns stay empty."""
    arch = normalize_arch(platform.machine())
    notes: list[str] = []
    info = _read("/proc/cpuinfo")
    # Only this architecture's key: under QEMU user-mode /proc/cpuinfo is the *host's* file.
    flag_key = {"x86_64": "flags", "aarch64": "features"}.get(arch, "flags")
    flags: set[str] = set()
    model = ""
    for line in info.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == flag_key and not flags:
            flags.update(value.split())
        elif key == "model name" and not model and arch != "aarch64":
            model = value.strip()
    sve_bits = 0
    if arch == "aarch64":
        hw = _auxv_flags()
        if hw is None:
            notes.append("getauxval unavailable; using /proc/cpuinfo only")
        else:
            flags = hw  # the kernel's own answer; cpuinfo may be missing or foreign
        if "sve" in flags:
            sve_bits = _sve_vector_bits()
        if not model:
            model = _arm_model(info)
    return CpuFeatures(
        arch=arch,
        flags=frozenset(flags),
        model_name=model or platform.processor() or arch,
        cores=_cores(),
        numa_nodes=max(1, len(glob.glob("/sys/devices/system/node/node[0-9]*"))),
        caches=_caches(),
        sve_vector_bits=sve_bits,
        notes=tuple(notes),
    )


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _caches() -> tuple[tuple[str, int], ...]:
    out: dict[str, int] = {}
    for d in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index[0-9]*")):
        level = _read(os.path.join(d, "level")).strip()
        kind = _read(os.path.join(d, "type")).strip()
        size = _read(os.path.join(d, "size")).strip().upper()
        if not level or not size:
            continue
        mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(size[-1:], 1)
        try:
            nbytes = int(size.rstrip("KMG")) * mult
        except ValueError:
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
        out[f"L{level}{suffix}"] = nbytes
    return tuple(sorted(out.items()))


def _auxv_flags() -> set[str] | None:
    try:
        libc = ctypes.CDLL(None)
        getauxval = libc.getauxval
    except (OSError, AttributeError):
        return None
    getauxval.restype = ctypes.c_ulong
    getauxval.argtypes = [ctypes.c_ulong]
    hwcap, hwcap2 = getauxval(_AT_HWCAP), getauxval(_AT_HWCAP2)
    flags = {name for bit, name in _HWCAP_BITS.items() if hwcap >> bit & 1}
    flags |= {name for bit, name in _HWCAP2_BITS.items() if hwcap2 >> bit & 1}
    return flags


def _sve_vector_bits() -> int:
    """Current SVE vector length via prctl(PR_SVE_GET_VL); 0 if the call is refused."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        prctl.restype = ctypes.c_int
        prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        ret = prctl(_PR_SVE_GET_VL, 0, 0, 0, 0)
    except (OSError, AttributeError):
        return 0
    return (ret & _PR_SVE_VL_LEN_MASK) * 8 if ret > 0 else 0


def _arm_model(info: str) -> str:
    for line in info.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "CPU part":
            return f"Arm CPU part {value.strip()}"
    return ""
