"""Final table of the Arm64 lane from the per-CPU JUnit XML files pytest wrote.

Usage: summarize.py [--require-kernel-tests] KERNEL_RE RUN...
where each RUN is ``cpu|junit.xml|exit_code|seconds``. Prints one row per CPU model and exits
non-zero when any run failed, crashed or ran no test, and, with --require-kernel-tests (the
extension was built), when a CPU model ran no Arm kernel test: every Arm CPU has at least Neon,
so zero means the extension did not load and its tests skipped.

"Arm kernel tests run" counts the test cases under tests/kernels/ whose id matches KERNEL_RE
(the Arm ISA variants: neon, dotprod, i8mm, sve, ...) and that were not skipped: the number
that shows each emulated CPU really exercised its own variants.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

EXIT_MEANING = {
    1: "tests failed",
    2: "interrupted / usage error",
    3: "pytest internal error",
    4: "pytest usage error",
    5: "no tests collected",
    124: "timed out",
    132: "SIGILL: an instruction the emulated CPU lacks",
    134: "SIGABRT",
    139: "SIGSEGV",
}


@dataclass
class Row:
    cpu: str
    rc: int
    seconds: float
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    arm_kernel_run: int = 0
    note: str = ""


def read(cpu: str, xml: Path, rc: int, seconds: float, kernel_re: re.Pattern[str]) -> Row:
    row = Row(cpu, rc, seconds)
    if not xml.is_file():
        row.note = "no junit xml (pytest did not finish)"
        return row
    for case in ET.parse(xml).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            row.failed += 1
        elif "error" in kinds:
            row.errors += 1
        elif "skipped" in kinds:
            row.skipped += 1
            continue
        else:
            row.passed += 1
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        if test_id.startswith("tests.kernels") and kernel_re.search(test_id):
            row.arm_kernel_run += 1
    return row


def main(argv: list[str]) -> int:
    require_kernels = bool(argv) and argv[0] == "--require-kernel-tests"
    if require_kernels:
        argv = argv[1:]
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    kernel_re = re.compile(argv[0], re.I)
    rows = []
    for spec in argv[1:]:
        cpu, xml, rc, seconds = spec.split("|")
        rows.append(read(cpu, Path(xml), int(rc), float(seconds), kernel_re))

    bad = False
    width = max(len("QEMU_CPU"), *(len(r.cpu) for r in rows))
    head = f"{'QEMU_CPU':<{width}}  {'result':<6} {'passed':>6} {'failed':>6} {'errors':>6} {'skipped':>7} {'arm-kernel-run':>14} {'time':>6}"
    print(head)
    print("-" * len(head))
    for r in rows:
        ok = r.rc == 0 and r.failed == 0 and r.errors == 0 and r.passed > 0
        note = r.note or ("" if ok else EXIT_MEANING.get(r.rc, f"exit code {r.rc}"))
        if r.rc == 0 and r.passed == 0 and not r.note:
            note = "no test passed"
        if ok and require_kernels and r.arm_kernel_run == 0:
            ok, note = False, "no Arm kernel test ran: the extension did not load (see the log)"
        bad |= not ok
        print(
            f"{r.cpu:<{width}}  {'ok' if ok else 'FAIL':<6} {r.passed:>6} {r.failed:>6} {r.errors:>6}"
            f" {r.skipped:>7} {r.arm_kernel_run:>14} {r.seconds:>5.0f}s" + (f"  {note}" if note else "")
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
