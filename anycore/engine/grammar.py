"""Structured output: a grammar per request, compiled once, that masks the tokens it cannot take.

The engine is xgrammar (https://github.com/mlc-ai/xgrammar), chosen over llguidance because it
takes every form the OpenAI/vLLM/SGLang APIs name (JSON schema, any JSON, regex, EBNF, choices)
from one Python package with a plain CPU wheel, keeps a compiled grammar immutable and shareable
(n samples share one, each with its own matcher), and fills the token bitmask of one row of a
batch bitmask in place, which is the layout the sampler applies in one op. llguidance would need
its grammar forms translated into its own Lark dialect and brings a second tokenizer adapter.
xgrammar's package metadata also names triton (for its GPU kernels, unused here), so it is
installed without its dependencies (see the Makefile) and imported only when a grammar is first
needed: its import pulls transformers (~4 s).

Threads: ``GrammarCompiler.compile`` runs on the server's worker threads (never the engine
thread there) and on the caller's thread offline; the LRU is guarded by a lock. Matchers are
per request and touched only by the thread that steps the engine.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from anycore.errors import AnycoreError, InvalidParameter

GrammarKind = Literal["json_object", "json_schema", "regex", "choice", "ebnf", "structural_tag"]
_KINDS = ("json_object", "json_schema", "regex", "choice", "ebnf", "structural_tag")


@dataclass
class StructuredOutput:
    """What the output must match: ``kind`` and its ``spec`` (a JSON schema as a dict or JSON
    text, a regex, a list of choices, an EBNF grammar; nothing for json_object). ``param`` names
    the request field it came from, for errors. ``structural_tag``: free text until one of
    ``spec["triggers"]`` appears, then one of ``spec["tags"]`` (``{"begin", "schema", "end"}``:
    the begin text, a JSON value matching the schema, the end text), then free text again (how
    strict tools are enforced under tool_choice "auto"). ``compiled`` is filled in by
    ``GrammarCompiler.compile`` and shared by every sample of a request."""

    kind: GrammarKind
    spec: Any = None
    param: str = "response_format"
    compiled: Any = field(default=None, compare=False, repr=False)
    compiled_by: Any = field(default=None, compare=False, repr=False)  # the GrammarCompiler (its vocabulary)

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise InvalidParameter(f"unknown structured output kind {self.kind!r}; one of {list(_KINDS)}",
                                   param=self.param)
        if self.kind == "choice":
            if (not isinstance(self.spec, list) or not self.spec
                    or not all(isinstance(c, str) and c for c in self.spec)):
                raise InvalidParameter("the choices must be a non-empty list of non-empty strings", param=self.param)
        elif self.kind in ("regex", "ebnf"):
            if not isinstance(self.spec, str) or not self.spec:
                raise InvalidParameter(f"the {self.kind} must be a non-empty string", param=self.param)
        elif self.kind == "json_schema":
            if isinstance(self.spec, str):
                try:
                    self.spec = json.loads(self.spec)
                except ValueError as e:
                    raise InvalidParameter(f"the JSON schema is not valid JSON: {e}", param=self.param) from e
            if not isinstance(self.spec, dict | bool):
                raise InvalidParameter("the JSON schema must be a JSON object", param=self.param)
        elif self.kind == "structural_tag":
            spec = self.spec if isinstance(self.spec, dict) else {}
            tags, triggers = spec.get("tags"), spec.get("triggers")
            if (not isinstance(tags, list) or not tags or not isinstance(triggers, list) or not triggers
                    or not all(isinstance(t, dict) and {"begin", "schema", "end"} <= set(t) for t in tags)
                    or not all(isinstance(t, str) and t for t in triggers)):
                raise InvalidParameter("a structural tag needs 'tags' ({begin, schema, end} objects) and 'triggers' "
                                       "(non-empty strings)", param=self.param)

    @property
    def key(self) -> tuple[str, str]:
        """The cache key: the kind and its spec in canonical text."""
        if self.kind in ("json_schema", "structural_tag"):
            return self.kind, json.dumps(self.spec, sort_keys=True, separators=(",", ":"))
        if self.kind == "choice":
            return self.kind, json.dumps(self.spec)
        return self.kind, self.spec or ""


_LOCATION = re.compile(r"^\[[^\]]*\]\s+\S+:\d+:\s*")


def _compile_structural_tag(compiler: Any, spec: dict[str, Any]) -> Any:
    import warnings

    import xgrammar as xgr

    tags = [xgr.StructuralTagItem(begin=t["begin"], schema=json.dumps(t["schema"]), end=t["end"]) for t in spec["tags"]]
    with warnings.catch_warnings():  # (the tags-and-triggers form is the one every 0.x release takes)
        warnings.simplefilter("ignore", DeprecationWarning)
        return compiler.compile_structural_tag(tags, spec["triggers"])


def _choice_regex(choices: list[str]) -> str:
    special = set(r"\.^$*+?{}[]|()/")
    return "|".join("(" + "".join("\\" + ch if ch in special else ch for ch in c) + ")" for c in choices)


def _import_xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError as e:
        raise AnycoreError("structured output needs the xgrammar package: pip install --no-deps xgrammar "
                           "apache-tvm-ffi (or make install)") from e
    return xgrammar


def _backend(tokenizer: Any) -> Any:
    """The `tokenizers` object behind anycore's TextTokenizer or a transformers fast tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise InvalidParameter("structured output needs a fast (tokenizer.json) tokenizer", param="response_format")
    return backend


class GrammarCompiler:
    """Compiles StructuredOutputs for one model's vocabulary; an LRU of compiled grammars keyed
    by ``StructuredOutput.key``. ``vocab_size`` is the width of the model's logits (which may
    exceed the tokenizer's vocabulary: xgrammar masks the extra ids off)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], cache_size: int = 128) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(stop_token_ids)
        self.cache_size = cache_size
        self._lock = threading.Lock()
        self._compiler: Any = None
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def _xgr_compiler(self) -> Any:
        with self._lock:
            if self._compiler is None:
                xgr = _import_xgrammar()

                backend = _backend(self.tokenizer)
                vocab = backend.get_vocab(with_added_tokens=True)
                encoded = [""] * self.vocab_size
                for token, idx in vocab.items():
                    if idx < self.vocab_size:
                        encoded[idx] = token
                # (vocab type and prefix-space rule read from tokenizer.json, as from_huggingface does)
                meta = xgr.TokenizerInfo._detect_metadata_from_hf(backend.to_str())
                info = xgr.TokenizerInfo(encoded, meta["vocab_type"], vocab_size=self.vocab_size,
                                         stop_token_ids=self.stop_token_ids or None,
                                         add_prefix_space=meta["add_prefix_space"])
                # xgrammar's own cache is off: the LRU below bounds what stays compiled
                self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
            return self._compiler

    def compile(self, so: StructuredOutput) -> Any:
        """The compiled grammar of ``so`` (cached; also stored on ``so.compiled``); raises
        InvalidParameter naming ``so.param`` when the spec does not compile."""
        if so.compiled is not None and so.compiled_by is self:
            return so.compiled
        key = so.key
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.hits += 1
        if hit is None:
            hit = self._compile(so)
            with self._lock:
                self.misses += 1
                self._cache[key] = hit
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        so.compiled, so.compiled_by = hit, self
        return hit

    def _compile(self, so: StructuredOutput) -> Any:
        compiler = self._xgr_compiler()
        try:
            if so.kind == "json_object":
                return compiler.compile_builtin_json_grammar()
            if so.kind == "json_schema":
                return compiler.compile_json_schema(json.dumps(so.spec), any_whitespace=False)
            if so.kind == "regex":
                return compiler.compile_regex(so.spec)
            if so.kind == "choice":
                return compiler.compile_regex(_choice_regex(so.spec))
            if so.kind == "structural_tag":
                return _compile_structural_tag(compiler, so.spec)
            return compiler.compile_grammar(so.spec)
        except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError for a bad spec
            text = str(e).strip()
            # (xgrammar prefixes its messages with a time stamp and its C++ source location)
            first = _LOCATION.sub("", text.splitlines()[0]) if text else type(e).__name__
            raise InvalidParameter(f"the {so.kind.replace('_', ' ')} does not compile: {first}",
                                   param=so.param) from e


class GrammarMatcher:
    """One request's position in its grammar."""

    def __init__(self, compiled: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        self._m = _import_xgrammar().GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self._words = bitmask_words(vocab_size)
        self._stop = [t for t in stop_token_ids if t < vocab_size]

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Writes the allowed next tokens into ``bitmask[row]`` (int32, bit j of word w: token 32w+j)."""
        self._m.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> bool:
        """Advances past ``token_id``; False when the grammar cannot take it."""
        return bool(self._m.accept_token(token_id))

    @property
    def is_terminated(self) -> bool:
        """The grammar reached its end (its stop token accepted): nothing more may follow."""
        return bool(self._m.is_terminated())

    @property
    def at_end(self) -> bool:
        """Nothing but a stop token may follow: the output is a complete match the grammar
        cannot extend (or the stop token itself was taken)."""
        if self._m.is_terminated():
            return True
        if not self._m.is_completed():
            return False
        row = torch.zeros((1, self._words), dtype=torch.int32)
        self._m.fill_next_token_bitmask(row, 0)
        allowed = allowed_tokens(row, self._words * 32)[0]
        allowed[self._stop] = False
        return not bool(allowed.any())


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def allowed_tokens(bitmask: torch.Tensor, width: int) -> torch.Tensor:
    """``[B, W] int32`` packed bitmask -> ``[B, width]`` bool, True where allowed."""
    return _unpack(bitmask.numpy(), width, pad=False)


def banned_tokens(bitmask: torch.Tensor, width: int) -> torch.Tensor:
    """``[B, width]`` bool, True where the bitmask does not allow the token (the sampler's
    ``masked_fill`` mask: the words are inverted before unpacking, ~1/32 of the work of
    inverting the unpacked mask)."""
    return _unpack(~bitmask.numpy(), width, pad=True)


def _unpack(words: np.ndarray, width: int, pad: bool) -> torch.Tensor:
    """numpy's unpackbits over the bytes of the words as little-endian int32 (byte k of word w
    then holds tokens 32w + 8k ..): ~0.1 ms for 8 rows of a 49k vocabulary, where shifting in
    torch took ~100x that. Columns past the bitmask's ``32 W`` (logits wider than the
    grammar's vocabulary) get ``pad``: those ids are never allowed."""
    rows = words.shape[0]
    bits = np.unpackbits(words.astype("<i4", copy=False).view(np.uint8), axis=-1, bitorder="little")
    out = torch.from_numpy(bits.view(bool).reshape(rows, -1))
    if out.shape[1] >= width:
        return out[:, :width]
    return torch.nn.functional.pad(out, (0, width - out.shape[1]), value=pad)
