"""`anycore serve --data-parallel-size N`: N replica servers behind the request router.

Each replica is a whole `anycore serve` process on 127.0.0.1 (its own engine, KV pool and prefix
cache) bound to its share of the CPUs; the router (server/router_proc.py) listens on the user's
--host/--port and routes with the chosen policy. Life cycle:

- start: replicas first, each on a free loopback port; the router only once every replica
  answers /health 200 (a replica that exits or stays unready past --replica-start-timeout stops
  everything, exit 1).
- running: the launcher polls its children. A replica that exits is logged at ERROR and taken
  out of the router at once (the router's own health check would too, within seconds); the
  others keep serving. The router exiting, or the last replica, stops everything (exit 1).
- stop: SIGINT/SIGTERM stop the router, then send SIGTERM to the replicas (each drains its
  in-flight requests for its --shutdown-timeout), then SIGKILL what is left. Every child also
  has PR_SET_PDEATHSIG, so even a SIGKILLed launcher leaves no process behind.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass

from anycore.server import router_proc

log = logging.getLogger("anycore.replicas")

LOOPBACK = "127.0.0.1"
POLL_S = 0.5
# flags of the launcher's own command line that a replica must not get (value-taking ones)
_LAUNCHER_FLAGS = {"--data-parallel-size", "--router-policy", "--replica-start-timeout", "--host", "--port"}


def add_replica_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("data-parallel replicas")
    g.add_argument("--data-parallel-size", type=int, default=1,
                   help="N > 1: N replica servers on 127.0.0.1, each with 1/N of the CPUs, behind vllm-router "
                        "on --host/--port (default: %(default)s, one server, no router)")
    g.add_argument("--router-policy", default="cache_aware", choices=list(router_proc.POLICIES),
                   help="with --data-parallel-size: how the router picks a replica (cache_aware: the replica "
                        "that served the longest prefix of this prompt while loads are even; default: %(default)s)")
    g.add_argument("--replica-start-timeout", type=float, default=900.0,
                   help="with --data-parallel-size: seconds every replica may take to load (default: %(default)s)")


def split_cpus(cpus: list[int], n: int) -> list[list[int]]:
    """``n`` contiguous, disjoint, near-equal groups (neighbouring ids share caches and NUMA nodes)."""
    if n < 1:
        raise ValueError("--data-parallel-size must be at least 1")
    if n > len(cpus):
        raise ValueError(f"--data-parallel-size {n} needs a CPU per replica; this process may use {len(cpus)}")
    cpus = sorted(cpus)
    q, r = divmod(len(cpus), n)
    out, i = [], 0
    for k in range(n):
        size = q + (1 if k < r else 0)
        out.append(cpus[i:i + size])
        i += size
    return out


def replica_argv(argv: list[str], port: int, threads: int | None) -> list[str]:
    """A replica's `anycore ...` arguments: the launcher's own, minus the launcher flags, plus
    its loopback address and (unless --threads was given) one thread per CPU it is bound to."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in _LAUNCHER_FLAGS:
            skip = "=" not in a
            continue
        out.append(a)
    out += ["--host", LOOPBACK, "--port", str(port)]
    if threads is not None and not any(a == "--threads" or a.startswith("--threads=") for a in argv):
        out += ["--threads", str(threads)]
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _child_setup(cpus: list[int] | None) -> Callable[[], None]:
    def setup() -> None:  # runs in the child between fork and exec
        if cpus:
            os.sched_setaffinity(0, cpus)
        if sys.platform.startswith("linux"):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    return setup


def http_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with router_proc.LOOPBACK_OPENER.open(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    url: str
    cpus: list[int] | None = None
    reported: bool = False  # its exit has been logged

    def start_line(self) -> str:
        cpus = f" on CPUs {','.join(map(str, self.cpus))}" if self.cpus else ""
        return f"{self.name}: pid {self.proc.pid} at {self.url}{cpus}"


class ReplicaSet:
    """The replica processes and the router; ``stop`` is safe to call at any point, twice."""

    def __init__(self) -> None:
        self.replicas: list[Child] = []
        self.router: Child | None = None

    def start_replicas(self, argv: list[str], n: int) -> None:
        groups = split_cpus(list(os.sched_getaffinity(0)), n)
        for k, cpus in enumerate(groups):
            port = free_port()
            cmd = [sys.executable, "-m", "anycore", *replica_argv(argv, port, len(cpus))]
            proc = subprocess.Popen(cmd, preexec_fn=_child_setup(cpus))
            child = Child(f"replica {k}", proc, f"http://{LOOPBACK}:{port}", cpus)
            self.replicas.append(child)
            log.info("started %s", child.start_line())

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(self.replicas)
        while pending:
            for c in list(pending):
                if c.proc.poll() is not None:
                    raise RuntimeError(f"{c.name} exited with status {c.proc.returncode} while loading")
                if http_status(f"{c.url}/health") == 200:
                    log.info("%s is ready", c.name)
                    pending.remove(c)
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"{', '.join(c.name for c in pending)} not ready after {timeout_s:.0f}s")
            if pending:
                time.sleep(POLL_S)

    def start_router(self, host: str, port: int, policy: str, timeout_s: float = 60.0) -> str:
        cmd = router_proc.router_argv(host, port, [c.url for c in self.replicas], policy, free_port())
        url = f"http://{LOOPBACK if host in ('0.0.0.0', '::', '') else host}:{port}"
        self.router = Child("router", subprocess.Popen(cmd, preexec_fn=_child_setup(None), env=router_proc.router_env()),
                            url)
        deadline = time.monotonic() + timeout_s
        while http_status(f"{url}/health") != 200:
            if self.router.proc.poll() is not None:
                raise RuntimeError(f"the router exited with status {self.router.proc.returncode} at start-up")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the router did not answer at {url} within {timeout_s:.0f}s")
            time.sleep(POLL_S)
        log.info("%s (vllm-router, policy %s) over %d replicas", self.router.start_line(), policy,
                 len(self.replicas))
        return url

    def live_replicas(self) -> list[Child]:
        return [c for c in self.replicas if c.proc.poll() is None]

    def check(self) -> bool:
        """One monitoring pass; False when serving can no longer go on."""
        for c in self.replicas:
            if c.proc.poll() is not None and not c.reported:
                c.reported = True
                removed = self.router is not None and router_proc.remove_worker(self.router.url, c.url)
                log.error("%s (pid %d, %s) EXITED with status %s; %s; %d of %d replicas still serving",
                          c.name, c.proc.pid, c.url, c.proc.returncode,
                          "removed from the router" if removed else "the router's health check will drop it",
                          len(self.live_replicas()), len(self.replicas))
        if self.router is not None and self.router.proc.poll() is not None:
            log.error("the router (pid %d) EXITED with status %s", self.router.proc.pid, self.router.proc.returncode)
            return False
        if not self.live_replicas():
            log.error("no replica is left")
            return False
        return True

    def stop(self, grace_s: float) -> None:
        if self.router is not None and self.router.proc.poll() is None:
            self.router.proc.terminate()  # stop taking requests first
        for c in self.live_replicas():
            c.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for c in [*self.replicas, *([self.router] if self.router else [])]:
            try:
                c.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0fs: killing it", c.name, grace_s)
                c.proc.kill()
                c.proc.wait()


class _Stop(Exception):
    pass


def _raise_stop(signum, frame) -> None:
    raise _Stop(signal.Signals(signum).name)


def run_data_parallel(args: argparse.Namespace, argv: list[str]) -> int:
    """The launcher's main: start, monitor until a signal or a fatal exit, stop. 0 after a
    signal, 1 when serving could not start or could not go on."""
    if not router_proc.router_available():
        raise ValueError("--data-parallel-size needs the router: pip install vllm-router (or anycore[replicas])")
    if args.api_key is not None:
        raise ValueError("--api-key with --data-parallel-size is not supported yet: vllm-router passes the "
                         "client's key on to a replica for inference requests but not for GET /v1/models")
    router_proc.router_argv(args.host, args.port, [], args.router_policy, 0)  # checks the policy up front
    rs = ReplicaSet()
    old = {s: signal.signal(s, _raise_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    status = 1
    try:
        rs.start_replicas(argv, args.data_parallel_size)
        rs.wait_ready(args.replica_start_timeout)
        url = rs.start_router(args.host, args.port, args.router_policy)
        log.info("serving at %s: %d replicas behind the router (Ctrl-C stops all)", url, len(rs.replicas))
        while rs.check():
            time.sleep(POLL_S)
    except _Stop as e:
        log.info("%s: stopping the router and %d replicas", e, len(rs.live_replicas()))
        status = 0
    except RuntimeError as e:
        log.error("%s", e)
    finally:
        for s in old:
            signal.signal(s, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        rs.stop(args.shutdown_timeout + 15.0)
        for s, h in old.items():
            signal.signal(s, h)
    return status
