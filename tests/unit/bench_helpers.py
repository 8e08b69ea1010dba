"""Shared by the bench tests: a checked `bench compare` context from flags, no model loaded."""

from __future__ import annotations

import argparse
from pathlib import Path

from anycore.bench.compare.args import add_compare_args
from anycore.bench.compare.context import CompareContext
from anycore.bench.compare.run import prepare
from anycore.config import EngineConfig


def compare_args(tmp_path: Path, *argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_compare_args(p)
    return p.parse_args(["--out", str(tmp_path / "r.json"), "--cache-dir", str(tmp_path / "cache"),
                         "--settle", "0", *argv])


def compare_context(tmp_path: Path, *argv: str, config: EngineConfig | None = None) -> CompareContext:
    return prepare(compare_args(tmp_path, *argv), config or EngineConfig(threads=2))
