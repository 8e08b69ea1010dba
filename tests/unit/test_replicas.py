"""The data-parallel launcher's pure parts: CPU split, replica command lines, router command line,
and the router-added request fields (server/replicas.py, server/router_proc.py, protocol.py)."""

from __future__ import annotations

import logging

import pytest

from anycore.cli import build_parser
from anycore.server import router_proc
from anycore.server.replicas import replica_argv, split_cpus


def test_split_cpus_contiguous_disjoint_and_covering():
    assert split_cpus([0, 1], 2) == [[0], [1]]
    assert split_cpus([3, 0, 2, 1, 4], 2) == [[0, 1, 2], [3, 4]]
    groups = split_cpus(list(range(7)), 3)
    assert [len(g) for g in groups] == [3, 2, 2]
    assert sorted(c for g in groups for c in g) == list(range(7))
    with pytest.raises(ValueError, match="needs a CPU per replica"):
        split_cpus([0, 1], 3)
    with pytest.raises(ValueError):
        split_cpus([0, 1], 0)


def test_replica_argv_drops_launcher_flags_and_binds_loopback():
    argv = ["--log-level", "DEBUG", "serve", "--data-parallel-size", "2", "--host", "0.0.0.0", "--port=9000",
            "--router-policy", "round_robin", "--kv-cache-gb", "0.5", "--replica-start-timeout=30",
            "--served-model-name", "a", "b"]
    out = replica_argv(argv, 41000, threads=3)
    assert out == ["--log-level", "DEBUG", "serve", "--kv-cache-gb", "0.5", "--served-model-name", "a", "b",
                   "--host", "127.0.0.1", "--port", "41000", "--threads", "3"]
    # the parent's parser accepts the replica's command line and sees no data parallelism in it
    args = build_parser().parse_args(out)
    assert (args.data_parallel_size, args.host, args.port, args.threads) == (1, "127.0.0.1", 41000, 3)


def test_replica_argv_keeps_an_explicit_thread_count():
    out = replica_argv(["serve", "--threads", "8", "--data-parallel-size=2"], 41001, threads=1)
    assert out == ["serve", "--threads", "8", "--host", "127.0.0.1", "--port", "41001"]


def test_router_argv_policy_health_and_loopback_metrics():
    argv = router_proc.router_argv("0.0.0.0", 8000, ["http://127.0.0.1:1", "http://127.0.0.1:2"],
                                   "cache_aware", 9100)
    joined = " ".join(argv)
    assert "--worker-urls http://127.0.0.1:1 http://127.0.0.1:2 --policy cache_aware" in joined
    assert "--prometheus-host 127.0.0.1 --prometheus-port 9100" in joined
    assert f"--health-check-interval-secs {router_proc.HEALTH_INTERVAL_S}" in joined
    assert argv[argv.index("--host") + 1] == "0.0.0.0" and argv[argv.index("--port") + 1] == "8000"
    with pytest.raises(ValueError, match="--router-policy"):
        router_proc.router_argv("127.0.0.1", 8000, [], "kv_aware", 9100)


def test_router_fields_at_neutral_values_are_not_unknown_other_values_are(caplog):
    from anycore.server.protocol import ChatCompletionRequest, CompletionRequest

    neutral = {"no_stop_trim": False, "return_hidden_states": False, "continue_final_message": False,
               "separate_reasoning": True, "stream_reasoning": True, "include_reasoning": True}
    with caplog.at_level(logging.WARNING, logger="anycore.server"):
        ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], **neutral
                              ).log_unknown_fields("/v1/chat/completions")
        CompletionRequest(prompt="x", no_stop_trim=False, return_hidden_states=False
                          ).log_unknown_fields("/v1/completions")
        assert caplog.records == []
        CompletionRequest(prompt="x", no_stop_trim=True, return_hidden_states=False
                          ).log_unknown_fields("/v1/completions")
    assert [r.getMessage() for r in caplog.records] == [
        "/v1/completions: request fields not known to this server, ignored: no_stop_trim"]


def test_a_replica_that_cannot_start_stops_the_launcher_with_nothing_left(caplog):
    """Replica command lines the replicas reject (argparse exits 2 at once): the launcher reports
    it, stops the other replica and returns 1 before any router starts."""
    import os

    import psutil

    from anycore.server.replicas import run_data_parallel

    pytest.importorskip("vllm_router")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two replicas need two CPUs")
    args = build_parser().parse_args(["serve", "--data-parallel-size", "2", "--replica-start-timeout", "120"])
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with caplog.at_level(logging.INFO, logger="anycore.replicas"):
        assert run_data_parallel(args, ["serve", "--no-such-flag"]) == 1
    text = caplog.text
    assert "started replica 0" in text and "started replica 1" in text
    assert "exited with status 2 while loading" in text and "router" not in text
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
