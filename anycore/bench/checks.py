"""Argument checks of `anycore bench ...`, run before any model load or measurement.

A bad path or value fails in one line (``BenchArgumentError``, exit status 2) while nothing has
been measured yet, instead of minutes into a run. Each check returns the value the run will use
(e.g. an output folder becomes the file inside it), so the run never re-interprets an argument.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


class BenchArgumentError(ValueError):
    """A command-line argument that cannot work; its message names the flag."""


def output_file(value: str, default_name: str, flag: str) -> Path:
    """The file a result goes to: ``value`` itself, or ``default_name`` inside it when ``value`` is
    an existing folder (or ends with a separator). Its folder must exist or be creatable."""
    path = Path(value).expanduser()
    if path.is_dir() or value.endswith(("/", os.sep)):
        path = path / default_name
    if path.exists() and not path.is_file():
        raise BenchArgumentError(f"{flag} {value}: {path} exists and is not a regular file")
    creatable_dir(path.parent, flag, value)
    return path


def creatable_dir(path: Path, flag: str, value: str | None = None) -> Path:
    """``path`` is a folder, or the nearest existing folder above it is writable so it can be made."""
    shown = value if value is not None else str(path)
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise BenchArgumentError(f"{flag} {shown}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise BenchArgumentError(f"{flag} {shown}: cannot write to {probe}")
    return path


def model_source(value: str | None, flag: str = "--model") -> Path:
    """A model the loader can open (a .gguf file, or a folder with config.json or exactly one
    .gguf); None is the default model. Only names and folder listings are read here."""
    if value is None:
        from anycore.loader.default_model import default_model_path

        try:
            return default_model_path()
        except FileNotFoundError as e:
            raise BenchArgumentError(f"{flag}: {e}") from None
    path = Path(value).expanduser()
    if not path.exists():
        raise BenchArgumentError(f"{flag} {value}: no such file or folder")
    if path.is_file():
        if path.suffix != ".gguf":
            raise BenchArgumentError(f"{flag} {value}: expected a .gguf file or an HF model folder")
        return path
    if not (path / "config.json").is_file() and len(list(path.glob("*.gguf"))) != 1:
        raise BenchArgumentError(f"{flag} {value}: folder holds neither config.json nor exactly one .gguf file")
    return path


def gguf_file(value: str | None, flag: str = "--model") -> Path:
    """Like ``model_source`` but a GGUF file only (llama.cpp peers read the very same file)."""
    path = model_source(value, flag)
    if not path.is_file():
        raise BenchArgumentError(f"{flag} {value}: needs a GGUF file (llama.cpp peers read the same file)")
    return path


def existing_file(value: str, flag: str) -> Path:
    path = Path(value).expanduser()
    if not path.is_file():
        raise BenchArgumentError(f"{flag} {value}: no such file")
    return path


def at_least(value: float, low: float, flag: str) -> None:
    if value < low:
        raise BenchArgumentError(f"{flag} {value}: must be >= {low:g}")


def positive(value: float, flag: str) -> None:
    if not value > 0:
        raise BenchArgumentError(f"{flag} {value}: must be > 0")


def names(value: str, allowed: tuple[str, ...], flag: str, allow_none: bool = False,
          required: bool = True) -> list[str]:
    """A comma list whose every item is in ``allowed`` (``none``: the empty list, where allowed)."""
    if allow_none and value.strip().lower() == "none":
        return []
    items = [v.strip() for v in value.split(",") if v.strip()]
    if required and not items:
        raise BenchArgumentError(f"{flag}: empty; choose from {', '.join(allowed)}")
    unknown = [v for v in items if v not in allowed]
    if unknown:
        raise BenchArgumentError(f"{flag}: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(allowed)}"
                                 + (" (or 'none')" if allow_none else ""))
    return items


def positive_ints(value: str, flag: str) -> list[int]:
    """A non-empty comma list of integers >= 1, e.g. ``--concurrency 1,4,16``."""
    try:
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise BenchArgumentError(f"{flag} {value}: expected a comma list of integers") from None
    if not items or min(items) < 1:
        raise BenchArgumentError(f"{flag} {value}: expected integers >= 1")
    return items


def threads(value: int | None) -> None:
    if value is not None:
        at_least(value, 1, "--threads")


# ---- per command ------------------------------------------------------------------------------
def check_offline(kind: str, args: argparse.Namespace) -> Path | None:
    """`bench latency | throughput`: the model, the lengths, the JSON file (None: no file)."""
    model_source(args.model)
    threads(args.threads)
    for flag in ("input_len", "output_len", "num_prompts", "repeats"):
        at_least(getattr(args, flag), 1, "--" + flag.replace("_", "-"))
    return output_file(args.json, f"{kind}.json", "--json") if args.json else None


def check_serving(args: argparse.Namespace) -> Path | None:
    """`bench serving`: the server address, load shape and files (None: no JSON file)."""
    if not args.base_url.startswith(("http://", "https://")):
        raise BenchArgumentError(f"--base-url {args.base_url}: expected http://host:port or https://...")
    at_least(args.concurrency, 1, "--concurrency")
    if args.num_prompts is not None:
        at_least(args.num_prompts, 1, "--num-prompts")
    positive(args.request_rate, "--request-rate")
    for flag in ("input_len", "output_len"):
        at_least(getattr(args, flag), 1, "--" + flag.replace("_", "-"))
    if not 0 <= args.range_ratio < 1:
        raise BenchArgumentError(f"--range-ratio {args.range_ratio}: must be in [0, 1)")
    lo, sep, hi = args.token_id_range.partition(":")
    if not (sep and lo.strip().isdigit() and hi.strip().isdigit() and int(lo) < int(hi)):
        raise BenchArgumentError(f"--token-id-range {args.token_id_range}: expected lo:hi with 0 <= lo < hi")
    at_least(args.warmup, 0, "--warmup")
    positive(args.timeout, "--timeout")
    if args.dataset_path:
        existing_file(args.dataset_path, "--dataset-path")
    return output_file(args.json_out, "serving.json", "--json-out") if args.json_out else None
