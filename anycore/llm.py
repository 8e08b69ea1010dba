"""The offline API, shaped like vLLM's: ``LLM(...).generate(prompts, params)`` and ``.chat(...)``."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from anycore.config import EngineConfig
from anycore.engine.engine import Engine
from anycore.engine.input_processor import EngineRequest, InputProcessor, Prompt
from anycore.errors import InvalidRequest
from anycore.outputs import CompletionOutput, RequestOutput
from anycore.sampling_params import SamplingParams
from anycore.scheduler.request import TokenLogprob


class LLM:
    """Runs a model in this process. ``model=None`` loads the default model (SmolLM2-135M-Instruct);
    other keywords are EngineConfig fields (``dtype``, ``kv_cache_gb``, ...), defaulting as there,
    except that nothing here streams: an unset ``decode_burst`` is the offline one
    (EngineConfig.for_offline)."""

    def __init__(self, model: str | None = None, **engine_kwargs: Any) -> None:
        self._attach(Engine(EngineConfig(model=model, **engine_kwargs).for_offline()))

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        llm = cls.__new__(cls)
        llm._attach(Engine(config.for_offline()))
        return llm

    def _attach(self, engine: Engine) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.inputs = InputProcessor.for_engine(engine)
        self._batch_ids = itertools.count()

    def close(self) -> None:
        """Stops the engine's tensor-parallel workers, if any (TP=1: nothing to stop)."""
        self.engine.close()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Generates for each prompt (text or token ids); results in prompt order, each with
        ``params.n`` samples. ``use_tqdm`` shows a progress bar over finished samples.

        Every prompt is validated before any is queued, so a bad one raises (InvalidRequest, a
        ValueError) without side effects.
        """
        prompt_list = self.inputs.split_prompts(prompts)
        params_list = list(params) if isinstance(params, Sequence) else [params or SamplingParams()] * len(prompt_list)
        if len(params_list) != len(prompt_list):
            raise InvalidRequest(f"{len(prompt_list)} prompts but {len(params_list)} sampling params")
        encoded = [self.inputs.encode_prompt(p) for p in prompt_list]
        batch = next(self._batch_ids)
        requests = [self.inputs.process(f"llm-{batch}-{i}", [ids], p)
                    for i, (ids, p) in enumerate(zip(encoded, params_list))]
        samples = self._run([r for group in requests for r in group], use_tqdm)
        return [
            RequestOutput(
                request_id=f"{i}", prompt=prompt if isinstance(prompt, str) else None, prompt_token_ids=ids,
                outputs=[samples[r.request_id].completion(r.index, p.logprobs is not None) for r in group],
                prompt_logprobs=samples[group[0].request_id].prompt_logprobs,
                num_cached_tokens=samples[group[0].request_id].num_cached_tokens,
            )
            for i, (prompt, ids, p, group) in enumerate(zip(prompt_list, encoded, params_list, requests))
        ]

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
        return self.inputs.encode_chat(messages, add_generation_prompt)

    def _run(self, requests: list[EngineRequest], use_tqdm: bool) -> dict[str, _Sample]:
        """Steps the engine until every request finished; a failure aborts them all."""
        engine = self.engine
        samples = {r.request_id: _Sample() for r in requests}
        try:
            for r in requests:
                engine.add_request(r.prompt_token_ids, r.params, r.request_id, r.index)
            with tqdm(total=len(requests), desc="generating", unit="sample", disable=not use_tqdm) as bar:
                while engine.has_unfinished():
                    for o in engine.step():
                        s = samples.get(o.request_id)
                        if s is None:
                            continue
                        s.text.append(o.delta_text)
                        s.token_ids.extend(o.new_token_ids)
                        s.logprobs.extend(o.new_logprobs)
                        if o.prompt_logprobs is not None:
                            s.prompt_logprobs = o.prompt_logprobs
                        if o.finished:
                            s.finish_reason = o.finish_reason
                            s.num_cached_tokens = o.num_cached_tokens
                            bar.update(1)
        except BaseException:
            for rid in samples:
                engine.abort(rid)
            raise
        return samples


class _Sample:
    """One sample's output, accumulated over steps."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.finish_reason: str | None = None
        self.prompt_logprobs: list[TokenLogprob | None] | None = None
        self.num_cached_tokens = 0  # prompt tokens the prefix cache served

    def completion(self, index: int, with_logprobs: bool) -> CompletionOutput:
        return CompletionOutput(index=index, text="".join(self.text), token_ids=self.token_ids,
                                finish_reason=self.finish_reason, logprobs=self.logprobs if with_logprobs else None)
