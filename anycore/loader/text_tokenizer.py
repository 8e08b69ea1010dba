"""The tokenizer anycore serves with: a Hugging Face ``tokenizer.json`` run by the `tokenizers`
library directly, and the chat template rendered as transformers renders it.

Why not transformers' tokenizer class: importing transformers and building its wrapper cost
every process that loads a model ~1.8 s and, measured on SmolLM2-135M engines, 33-36 MB of
resident memory (bf16 568 -> 535 MB, W8A8 518 -> 482 MB after loading), and its decode takes
~9 us a call against 3 us here, twice per generated token in the detokenizer. anycore needs only encode, decode, the chat template, the
special tokens and saving the files. transformers stays the fallback for a folder without a
``tokenizer.json`` (slow-only tokenizers) and converts a GGUF vocabulary once
(``loader/tokenizer.py``); the tests check both agree token for token.

Chat templates are untrusted code from model repositories: they run in jinja2's immutable
sandbox with transformers' settings (trim_blocks, lstrip_blocks, loop controls, ``tojson``
without HTML escaping, ``raise_exception``, ``strftime_now``, a pass-through ``generation`` tag).
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
          "special_tokens_map.json")


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    """The default template: chat_template.jinja, else chat_template.json, else the config's
    (a string, or a list of named templates of which "default" is used)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = _read_json(folder / "chat_template.json").get("chat_template") or config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


@lru_cache(maxsize=16)
def _compile(template: str) -> Any:
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """``{% generation %}...{% endgeneration %}`` (marks assistant tokens for training):
        rendered as its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


class TextTokenizer:
    """encode / decode / apply_chat_template / save_pretrained over a folder's tokenizer files."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._tok = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        config = {**_read_json(self.folder / "special_tokens_map.json"),
                  **_read_json(self.folder / "tokenizer_config.json")}
        self.special_tokens_map = {k: t for k in _SPECIAL if (t := _token_text(config.get(k))) is not None}
        self.chat_template = _chat_template(self.folder, config)
        self.bos_token_id = self._id(self.special_tokens_map.get("bos_token"))
        self.eos_token_id = self._id(self.special_tokens_map.get("eos_token"))
        self.pad_token_id = self._id(self.special_tokens_map.get("pad_token"))
        # tokenizer.json's post-processor is used as written: transformers 5 does the same even
        # when the config names add_bos_token (tests check both agree with such configs)

    @property
    def backend_tokenizer(self) -> Tokenizer:
        """The `tokenizers` object (transformers' name for it), for structured output's vocabulary."""
        return self._tok

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int] | int, skip_special_tokens: bool = False) -> str:
        return self._tok.decode([ids] if isinstance(ids, int) else list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        """The vocabulary strings of ``ids`` (byte-level BPE spells a leading space "Ġ")."""
        return [self._tok.id_to_token(i) for i in ids]

    def apply_chat_template(self, conversation: list[dict[str, Any]], add_generation_prompt: bool = False,
                            tokenize: bool = True, tools: list[dict] | None = None,
                            documents: list[dict] | None = None, **kwargs: Any) -> list[int] | str:
        """transformers' rendering for one conversation: messages with None values dropped, the
        special tokens and ``kwargs`` as template variables; tokenized without added specials
        (the template writes them)."""
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        messages = [{k: v for k, v in dict(m).items() if v is not None} for m in conversation]
        text = _compile(self.chat_template).render(
            messages=messages, tools=tools, documents=documents, add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens_map, **kwargs})
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def save_pretrained(self, out: str | Path) -> None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        for name in _FILES:
            if (self.folder / name).is_file():
                shutil.copyfile(self.folder / name, out / name)
