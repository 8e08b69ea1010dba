"""Paths on the command line are checked before any model load, server start or measurement."""

from __future__ import annotations

import pytest

from anycore import cli


@pytest.fixture
def no_work(monkeypatch):
    """Every command's expensive step fails the test if it is reached."""
    def reached(*a, **k):
        raise AssertionError("work started before the arguments were checked")

    import anycore.engine.engine as engine_module
    import anycore.server.app as app_module

    monkeypatch.setattr(app_module, "run_server", reached)
    monkeypatch.setattr(engine_module, "Engine", reached)
    monkeypatch.setattr("anycore.llm.LLM.from_config", reached)


@pytest.mark.parametrize("argv, message", [
    (["serve", "--model", "/nonexistent/model.gguf"], "--model /nonexistent/model.gguf: no such file or folder"),
    (["generate", "--model", "/nonexistent", "--prompt", "hi"], "--model /nonexistent: no such file or folder"),
    (["eval", "perplexity", "--dataset", "/nonexistent.txt"], "--dataset /nonexistent.txt: no such file"),
])
def test_missing_paths_are_one_line_and_exit_2(no_work, capsys, argv, message):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"anycore: error: {message}"]


def test_json_and_out_targets(no_work, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("some text")
    assert cli.main(["eval", "perplexity", "--dataset", str(text), "--json", str(tmp_path)]) == 2
    assert "must be a file in an existing folder" in capsys.readouterr().err
    assert cli.main(["eval", "perplexity", "--dataset", str(text), "--json", str(tmp_path / "no" / "r.json")]) == 2
    assert cli.main(["quantize", "--out", str(text)]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err
