"""200 hostile requests (the classes of scripts/fuzz_server.py) against the session server while a
well-behaved greedy client runs: each answer a 4xx with an OpenAI-shaped body, the server alive,
the well-behaved client's text unchanged; then a storm of cut streams leaves nothing behind."""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from disconnect_storm import storm, wait_idle  # noqa: E402
from fuzz_server import make_cases, run_fuzz  # noqa: E402
from serverkit import LiveServer, Prober, probe_once  # noqa: E402


def _live(server) -> LiveServer:
    return LiveServer(server.url, server.proc, server.log_path, headers=server.headers, model=server.model)


def test_make_cases_covers_every_class() -> None:
    cases = make_cases(200, seed=1)
    kinds = Counter(c.kind for c in cases)
    assert len(cases) == 200
    assert set(kinds) >= {"bad_json", "wrong_types", "huge_numbers", "deep_nesting", "invalid_utf8", "token_ids",
                          "bad_values", "wrong_route", "conflicting"}


def test_hostile_requests_get_4xx_and_do_not_disturb_a_client(server) -> None:
    srv = _live(server)
    reference = probe_once(srv)
    cases = make_cases(200, seed=7)
    cases += [c for c in make_cases(400, seed=8) if c.kind in ("big_body", "huge_string")][:3]
    with Prober(srv, reference, max_seconds=600) as prober:
        report = run_fuzz(srv, cases, workers=4)
    assert not report.transport_errors, report.transport_errors[:5]
    assert not report.failures, report.failures[:5]
    assert report.total == len(cases)
    assert all(400 <= int(s) < 500 for s in report.statuses), report.statuses
    assert server.proc.poll() is None
    assert not prober.errors and not prober.mismatches
    assert prober.done >= 1
    assert probe_once(srv) == reference


def test_disconnect_storm_leaves_no_running_request_or_held_kv(server) -> None:
    srv = _live(server)
    reference = probe_once(srv)
    cuts, errors = storm(srv, streams=60, plain=10, concurrency=8)
    assert cuts == 70 and not errors, errors[:5]
    m, _ = wait_idle(srv, 120)
    assert m["anycore_num_requests_running"] == 0
    assert m["anycore_num_requests_waiting"] == 0
    assert m["anycore_num_requests_queued"] == 0
    assert m["anycore_kv_slots_held"] == 0
    time.sleep(0.1)
    assert probe_once(srv) == reference
