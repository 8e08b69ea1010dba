"""The offline API, shaped like vLLM's: ``LLM(...).generate(prompts, params)`` and ``.chat(...)``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from anycore.config import EngineConfig
from anycore.engine.engine import Engine
from anycore.outputs import CompletionOutput, RequestOutput
from anycore.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    """Runs a model in this process. ``model=None`` loads the default model (SmolLM2-135M-Instruct)."""

    def __init__(self, model: str | None = None, dtype: str = "bfloat16", **engine_kwargs: Any) -> None:
        self._attach(Engine(EngineConfig(model=model, dtype=dtype, **engine_kwargs)))

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        llm = cls.__new__(cls)
        llm._attach(Engine(config))
        return llm

    def _attach(self, engine: Engine) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Generates for each prompt (text or token ids); results in prompt order.

        Every prompt is validated before any is queued, so a bad one raises without side effects.
        """
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        params_list = list(params) if isinstance(params, Sequence) else [params or SamplingParams()] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params_list)} sampling params")
        encoded = [self._encode(p) for p in prompts]
        for ids, p in zip(encoded, params_list):
            p.validate()
            if len(ids) >= self.engine.max_model_len:
                raise ValueError(
                    f"prompt has {len(ids)} tokens; this model's context is {self.engine.max_model_len} tokens"
                )
        return self._run(prompts, encoded, params_list)

    def chat(
        self,
        messages: list[dict[str, str]] | list[list[dict[str, str]]],
        params: SamplingParams | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Applies the model's chat template to one conversation (or a list of them)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.apply_chat_template(c, add_generation_prompt) for c in conversations]  # type: ignore[arg-type]
        return self.generate(prompts, params)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        if not messages:
            raise ValueError("messages is empty")
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError("this model has no chat template; use generate() with a plain prompt")
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers >= 5 returns an encoding
            ids = ids["input_ids"]
        return list(ids)

    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("the prompt is empty")
            return self.tokenizer.encode(prompt)
        if not prompt:
            raise ValueError("the prompt is empty")
        return list(prompt)

    def _run(self, prompts, encoded, params_list) -> list[RequestOutput]:
        engine = self.engine
        groups: list[tuple[str, list[str]]] = []
        for i, (ids, p) in enumerate(zip(encoded, params_list)):
            subs = []
            for j in range(p.n):
                seed = p.seed + j if p.seed is not None else None
                sub = dataclasses.replace(p, n=1, seed=seed)
                subs.append(engine.add_request(ids, sub, request_id=f"llm-{id(self)}-{i}-{j}"))
            groups.append((f"{i}", subs))
        texts: dict[str, list[str]] = {rid: [] for _, subs in groups for rid in subs}
        tokens: dict[str, list[int]] = {}
        reasons: dict[str, str | None] = {}
        logprobs: dict[str, list] = {}
        try:
            while engine.has_unfinished():
                for o in engine.step():
                    if o.request_id not in texts:
                        continue
                    texts[o.request_id].append(o.delta_text)
                    tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
                    logprobs.setdefault(o.request_id, []).extend(o.new_logprobs)
                    if o.finished:
                        reasons[o.request_id] = o.finish_reason
        except BaseException:
            for rid in texts:
                engine.abort(rid)
            raise
        outputs = []
        for (i, subs), prompt, ids, p in zip(groups, prompts, encoded, params_list):
            completions = []
            for j, rid in enumerate(subs):
                completions.append(CompletionOutput(
                    index=j,
                    text="".join(texts[rid]),
                    token_ids=tokens.get(rid, []),
                    finish_reason=reasons.get(rid),
                    logprobs=logprobs.get(rid, []) if p.logprobs is not None else None,
                ))
            outputs.append(RequestOutput(
                request_id=i, prompt=prompt if isinstance(prompt, str) else None,
                prompt_token_ids=ids, outputs=completions,
            ))
        return outputs
