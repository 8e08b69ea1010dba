"""Incremental detokenization with stop strings.

Each step decodes only the tokens since the last released text plus the chunk before it (for
word-boundary context), so per-token cost does not grow with the output; a delta is released
only once it no longer ends in an incomplete UTF-8 sequence
(U+FFFD), so multi-byte characters never break across stream chunks. Text that could be the
start of a stop string is held back until it is known not to be one.
"""

from __future__ import annotations

from typing import Any

_WINDOW = 6  # tokens of left context decoded with each new token


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_ids: list[int], stop: list[str], skip_special: bool, include_stop: bool):
        self.tokenizer = tokenizer
        self.ids: list[int] = list(prompt_ids[-_WINDOW:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.stop = stop
        self.skip_special = skip_special
        self.include_stop = include_stop
        self.text = ""  # output text so far (truncated at a stop string once one is hit)
        self.emitted = 0  # characters of ``text`` already handed out
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)

    def add(self, token_ids: list[int]) -> None:
        """Consumes new output tokens; sets ``stopped`` when a stop string appears."""
        if self.stopped:
            return
        self.ids.extend(token_ids)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            new = full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self._append(new)

    def _append(self, new: str) -> None:
        start = max(0, len(self.text) - max((len(s) for s in self.stop), default=0))
        self.text += new
        for s in self.stop:
            idx = self.text.find(s, start)
            if idx != -1:
                self.text = self.text[: idx + len(s)] if self.include_stop else self.text[:idx]
                self.stopped = True
                return

    def delta(self, final: bool) -> str:
        """Text not yet handed out; while unfinished, a tail that may begin a stop string is held."""
        end = len(self.text)
        if not final and self.stop and not self.stopped:
            end -= self._stop_prefix_tail()
        out = self.text[self.emitted : end]
        self.emitted = max(self.emitted, end)
        return out

    def _stop_prefix_tail(self) -> int:
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best
