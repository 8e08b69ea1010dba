"""The programs bench runs in child processes: started by file path with JSON arguments, they
import nothing of the harness before measuring, and their failures come back as skips."""

from __future__ import annotations

import ast
import importlib.util
import os

import pytest

from anycore.bench import children
from anycore.bench.children import memory_child
from anycore.bench.compare import memory_phase as memory
from anycore.bench.peers.base import PeerUnavailable
from anycore.bench.peers.llama_cpp import probe_llama_cpp

no_llama_cpp = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is not None,
                                  reason="llama_cpp is installed: the child would really run it")


@pytest.mark.parametrize("program", ["memory_child", "llama_probe"])
def test_children_import_only_the_standard_library_up_front(program):
    """The first RSS point is 'after importing the engine': the program itself adds nothing."""
    tree = ast.parse((children.CHILDREN / f"{program}.py").read_text())
    top = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            top.add(node.module)
    assert top <= {"__future__", "json", "sys"}, top


def test_child_runs_the_parents_anycore():
    env = children.child_env()
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(children.ANYCORE_ROOT)
    assert (children.ANYCORE_ROOT / "anycore" / "bench" / "children" / "memory_child.py").is_file()
    with pytest.raises(FileNotFoundError):
        children.command("no_such_program", {})


def test_status_counters_are_bytes():
    status = memory_child.read_status()
    assert status["VmRSS"] > 1 << 20 and status["VmHWM"] >= status["VmRSS"]


def test_report_line_is_found_among_other_output():
    out = f"loading...\n{memory_child.RESULT_MARKER}" + '{"load": {"VmRSS": 5}}\nbye\n'
    assert memory.parse_report(out) == {"load": {"VmRSS": 5}}
    assert memory.parse_report("no report\n") is None


def test_unknown_engine_is_a_failed_probe():
    r = children.run_child("memory_child", {"engine": "vllm", "gen_tokens": 1}, timeout=120)
    assert r.returncode == 2 and "unknown engine 'vllm'" in r.stderr
    with pytest.raises(PeerUnavailable, match=r"memory probe failed \(rc 2\)"):
        memory._measure({"engine": "vllm", "gen_tokens": 1}, timeout=120)


@no_llama_cpp
def test_missing_llama_cpp_in_the_children_is_a_skip(tmp_path):
    with pytest.raises(PeerUnavailable, match="llama_cpp"):
        memory.llama_cpp_rss(tmp_path / "m.gguf", threads=1, gen_tokens=1, timeout=120)
    with pytest.raises(PeerUnavailable, match="probe failed"):
        probe_llama_cpp(tmp_path / "m.gguf", threads=1, timeout=120)


@pytest.mark.slow
def test_anycore_rss_in_a_fresh_process():
    from anycore.config import EngineConfig

    r = memory.anycore_rss(EngineConfig(threads=1, kv_cache_gb=0.05), gen_tokens=2, timeout=600)
    assert set(r) == {"import", "load", "generate", "weight_bytes"} and r["weight_bytes"] > 0
    assert r["import"]["VmRSS"] < r["load"]["VmRSS"] <= r["generate"]["VmHWM"]
