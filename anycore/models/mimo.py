"""MiMo (Xiaomi MiMo-7B): a Qwen2 decoder whose checkpoint also carries multi-token-prediction
layers, ``model.mtp_layers.{i}.*`` (``num_nextn_predict_layers`` of them).

The MTP layers are not part of the target: its forward is Qwen2's, so this class loads every
other tensor as the Llama family does and sets the MTP tensors aside by name
(``mtp_weight_names``), logging that they exist. ``--speculative-algorithm mtp`` builds its
draft head from them (anycore/spec/eagle_head.py, layout ``mtp``); without it they are unused.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

import torch

from anycore.models.llama import LlamaForCausalLM
from anycore.models.registry import register

log = logging.getLogger("anycore")

MTP_PREFIX = "model.mtp_layers."


@register("MiMoForCausalLM")
class MiMoForCausalLM(LlamaForCausalLM):
    mtp_prefix = MTP_PREFIX

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.mtp_weight_names: list[str] = []

        def target_only() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                if name.startswith(self.mtp_prefix):
                    self.mtp_weight_names.append(name)
                    continue
                yield name, tensor

        super().load_weights(target_only())
        if self.mtp_weight_names:
            log.info("%d MTP tensors (%s*) are not part of the target; --speculative-algorithm mtp drafts "
                     "with them", len(self.mtp_weight_names), self.mtp_prefix)
