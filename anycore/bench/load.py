"""Machine load while a benchmark runs: how many cores *other* processes kept busy.

Other load = (busy CPU time of the whole machine, from /proc/stat) minus (CPU time of this process
and its children, e.g. the server under test), divided by wall time. A background thread samples
every ``interval`` seconds so a short burst from another tenant shows up in ``max``.
On systems without /proc/stat, psutil's system-wide times are used instead.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import psutil


def system_busy_seconds() -> float:
    """CPU seconds spent non-idle by all cores since boot."""
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()
        ticks = [int(x) for x in parts[1:]]
        hz = os.sysconf("SC_CLK_TCK")
        # user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
        busy = sum(ticks[:8]) - idle
        return busy / hz
    except (OSError, ValueError, IndexError):
        t = psutil.cpu_times()
        return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _proc_seconds(p: psutil.Process) -> float:
    # own time only: a reaped child's time would otherwise be counted twice (it is tracked itself)
    t = p.cpu_times()
    return t.user + t.system


class OwnTree:
    """CPU seconds used by this process and its descendants.

    Live descendants count their own time; once a child exits and is reaped, its time (and that of
    the descendants it reaped) moves into this process's ``children_*`` times, which count too. So a
    short-lived child such as the bandwidth probe is ours even if no sample saw it alive.
    """

    def __init__(self, root: psutil.Process | None = None) -> None:
        self.root = root or psutil.Process()

    def seconds(self) -> float:
        t = self.root.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        try:
            children = self.root.children(recursive=True)
        except psutil.Error:
            children = []
        for p in children:
            try:
                total += _proc_seconds(p)
            except psutil.Error:  # exited between listing and reading: counted once reaped
                continue
        return total


@dataclass
class LoadReport:
    wall_s: float = 0.0
    other_cores: float = 0.0  # mean over the window
    other_cores_max: float = 0.0  # busiest sampling interval
    own_cores: float = 0.0
    samples: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, float]:
        return {"wall_s": round(self.wall_s, 3), "other_cores": round(self.other_cores, 3),
                "other_cores_max": round(self.other_cores_max, 3), "own_cores": round(self.own_cores, 3)}


class LoadMonitor:
    """Context manager: ``with LoadMonitor() as m: work()`` then ``m.report``."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.report = LoadReport()
        self._tree = OwnTree()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> tuple[float, float, float]:
        return time.perf_counter(), system_busy_seconds(), self._tree.seconds()

    def _loop(self) -> None:
        prev = self._sample()
        while not self._stop.wait(self.interval):
            cur = self._sample()
            dt = cur[0] - prev[0]
            if dt > 0:
                self.report.samples.append(max(0.0, ((cur[1] - prev[1]) - (cur[2] - prev[2])) / dt))
            prev = cur

    def __enter__(self) -> LoadMonitor:
        self._start = self._sample()
        self._thread = threading.Thread(target=self._loop, name="load-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        end = self._sample()
        wall = end[0] - self._start[0]
        busy, own = end[1] - self._start[1], end[2] - self._start[2]
        r = self.report
        r.wall_s = wall
        if wall > 0:
            r.other_cores = max(0.0, (busy - own) / wall)
            r.own_cores = own / wall
        r.other_cores_max = max([r.other_cores, *r.samples])


def top_other_processes(n: int = 3, window: float = 0.5) -> list[tuple[str, float]]:
    """The ``n`` busiest processes outside our tree over ``window`` seconds, as (name, cores)."""
    own = {psutil.Process().pid} | {c.pid for c in psutil.Process().children(recursive=True)}
    procs = {}
    for p in psutil.process_iter(["name"]):
        if p.pid in own:
            continue
        try:
            procs[p.pid] = (p, _proc_seconds(p))
        except psutil.Error:
            continue
    time.sleep(window)
    out = []
    for p, before in procs.values():
        try:
            out.append((p.info["name"] or str(p.pid), (_proc_seconds(p) - before) / window))
        except psutil.Error:
            continue
    out.sort(key=lambda x: -x[1])
    return [(name, round(c, 2)) for name, c in out[:n] if c > 0.01]


def wait_for_quiet(max_other_cores: float, max_wait: float, window: float = 1.0) -> bool:
    """Waits (up to ``max_wait`` s) for a ``window`` in which other processes used at most
    ``max_other_cores``; True when one came (or no wait was asked for)."""
    if max_wait <= 0:
        return True
    end = time.monotonic() + max_wait
    while time.monotonic() < end:
        with LoadMonitor(interval=window) as mon:
            time.sleep(window)
        if mon.report.other_cores <= max_other_cores:
            return True
    return False
