"""The request router in front of data-parallel replicas: vllm-router (PyPI ``vllm-router``).

Why vllm-router and not sglang-router (both are Rust binaries on PyPI with a cache-aware policy:
a radix tree per replica over the request text, prefix affinity while load is balanced,
shortest queue when it is not). Both were run against this server on loopback:

- vllm-router forwards a request's JSON fields it does not know (our extras keep working);
  sglang-router re-serializes chat bodies through its own schema and drops unknown fields, so a
  field this server honours could vanish between client and replica without a trace.
- vllm-router answers ``GET /v1/models`` from a replica (the served model names); sglang-router
  answers with its own list (model ``unknown``) unless a replica reports a ``model_path``, and
  with one it tries to fetch that model's tokenizer from the Hugging Face hub.
- both probe ``/health`` for liveness, route ``/v1/chat/completions``, ``/v1/completions`` and
  ``/generate`` and stream SSE through. With the cache_aware policy vllm-router also asks every
  replica for the request's token ids first (vLLM's ``/v1/{chat/}completions/render``, which
  server/render_api.py implements; without it, a 404 and then ``/tokenize``): that call is most
  of what the router adds to a request (scripts/bench_router.py measures it).

The router adds fields of its own to forwarded bodies, each at its neutral value (e.g.
``no_stop_trim: false``); ``protocol.py`` accepts exactly those values (``ROUTER_NEUTRAL_FIELDS``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

ROUTER_PACKAGE = "vllm_router"
# the policies `--router-policy` offers (vllm-router has more; these need no extra services)
POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")
# A replica that fails this many health probes in a row, HEALTH_INTERVAL_S apart, leaves the
# rotation (the router's defaults, 3 x 60 s, would route to a dead replica for minutes).
HEALTH_INTERVAL_S = 1
HEALTH_FAILURES = 2
# Load imbalance (in-flight requests) beyond which cache affinity yields to the shortest queue;
# the router's default (64) suits GPU replicas. A CPU replica runs a few sequences at once.
BALANCE_ABS = 4
BALANCE_REL = 1.5


def router_available() -> bool:
    return importlib.util.find_spec(ROUTER_PACKAGE) is not None


def router_argv(host: str, port: int, worker_urls: list[str], policy: str, metrics_port: int,
                log_level: str = "info") -> list[str]:
    """The router's command line. Its Prometheus exporter always listens on loopback."""
    if policy not in POLICIES:
        raise ValueError(f"--router-policy {policy}: choose one of {', '.join(POLICIES)}")
    return [sys.executable, "-m", f"{ROUTER_PACKAGE}.launch_router",
            "--host", host, "--port", str(port),
            "--worker-urls", *worker_urls,
            "--policy", policy,
            "--balance-abs-threshold", str(BALANCE_ABS), "--balance-rel-threshold", str(BALANCE_REL),
            "--health-check-interval-secs", str(HEALTH_INTERVAL_S),
            "--health-failure-threshold", str(HEALTH_FAILURES),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
            "--log-level", log_level]


# loopback traffic never goes through an HTTP(S)_PROXY from the environment
LOOPBACK_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def router_env() -> dict[str, str]:
    """The router's environment: its HTTP client honours *_PROXY too, so loopback is exempted."""
    env = dict(os.environ)
    for key in ("NO_PROXY", "no_proxy"):
        env[key] = ",".join(filter(None, [env.get(key, ""), "127.0.0.1", "localhost"]))
    return env


def _call(url: str, method: str = "GET", timeout: float = 5.0) -> tuple[int, str]:
    req = urllib.request.Request(url, method=method)
    try:
        with LOOPBACK_OPENER.open(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def router_workers(router_url: str) -> list[str]:
    """The replica URLs the router routes to now."""
    status, body = _call(f"{router_url}/list_workers")
    if status != 200:
        raise RuntimeError(f"router {router_url}/list_workers answered {status}: {body[:200]}")
    return list(json.loads(body).get("urls", []))


def remove_worker(router_url: str, worker_url: str) -> bool:
    """Take a replica out of the rotation at once (the health check would within
    HEALTH_INTERVAL_S * HEALTH_FAILURES seconds; a request in that window gets a 5xx)."""
    q = urllib.parse.urlencode({"url": worker_url})
    try:
        status, _ = _call(f"{router_url}/remove_worker?{q}", method="POST")
    except OSError:
        return False
    return status == 200
