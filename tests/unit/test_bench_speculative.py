"""`anycore bench speculative`: bad flags end the command before any engine is built; a short
real run on the default model writes every figure and finds the speculative tokens identical to
the plain ones."""

from __future__ import annotations

import json

import pytest

from anycore import cli
from anycore.bench.spec_workloads import INPUT_GROUNDED, SPEC_WORKLOADS
from anycore.engine import engine as engine_module


def _tripwire(*_a, **_k):
    raise AssertionError("an engine was built before the arguments were checked")


@pytest.mark.parametrize(("argv", "flag"), [
    (["--methods", "medusa"], "--methods"),
    (["--workloads", "poetry"], "--workloads"),
    (["--methods", "draft"], "--methods draft"),
    (["--methods", "eagle"], "--methods eagle"),
    (["--output-len", "1"], "--output-len"),
    (["--repeats", "0"], "--repeats"),
    (["--peers", "vllm"], "--peers"),
    (["--cost-batches", "1,x"], "--cost-batches"),
])
def test_bad_flags_fail_before_any_work(monkeypatch, capsys, argv, flag):
    monkeypatch.setattr(engine_module.Engine, "__init__", _tripwire)
    assert cli.main(["bench", "speculative", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "error:" in err and flag in err, err


def test_workloads_are_grounded_or_open():
    assert set(INPUT_GROUNDED) < set(SPEC_WORKLOADS) and "chat" not in INPUT_GROUNDED
    for name in INPUT_GROUNDED:  # (the prompt carries the text the answer copies)
        assert len(SPEC_WORKLOADS[name]) > 300


@pytest.mark.slow
def test_short_run_reports_identical_tokens_and_acceptance(tmp_path, capsys):
    out = tmp_path / "spec.json"
    rc = cli.main(["bench", "speculative", "--workloads", "list,chat", "--output-len", "24", "--repeats", "1",
                   "--cost", "--cost-batches", "1,2", "--cost-steps", "2", "--json", str(out)])
    assert rc == 0, capsys.readouterr().out
    result = json.loads(out.read_text())
    cells = result["anycore"]["ngram"]["workloads"]
    assert set(cells) == {"list", "chat"}
    for cell in cells.values():
        assert cell["identical"] is True
        assert cell["plain_tok_s"] > 0 and cell["spec_tok_s"] > 0
        assert cell["acceptance_length"] >= 1.0
    assert cells["list"]["acceptance_length"] > 1.0  # (the schedule's lines repeat: drafts are accepted)
    assert [row["batch"] for row in result["cost"]] == [1, 2]
    assert result["meta"]["cpu_model"]
