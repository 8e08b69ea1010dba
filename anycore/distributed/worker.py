"""A tensor-parallel worker rank (1 .. N-1): loads its shard, then runs what rank 0 broadcasts.

Started by rank 0's engine for the ranks on its host (``python -m anycore.distributed.worker
SPEC_JSON``), or by ``anycore serve --node-rank K`` for another node's ranks. Protocol on the
control group, in the order rank 0 sends (every rank runs the same collectives in the same order):

- ``("init", {"num_slots", "max_len"})`` once: the KV pool and rotary table sizes rank 0 chose;
- ``("forward", arrays)``: one step's batch (the runner's ForwardBatch index tensors, which are
  the step plan in tensor form: tokens, positions, slots); the worker runs the same op-by-op
  forward on its shard, joining each all-reduce;
- ``("logits", hidden)``: rank 0 computes logits from ``hidden``; the worker computes its vocab
  slice's and joins the gather;
- ``("stop", None)``: exit 0.

A worker exits (non-zero, with a log line) when a collective fails, e.g. rank 0 died.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from anycore.config import EngineConfig, parse_dtype
from anycore.distributed.group import ParallelGroup, Placement, RankFailure, apply_placement
from anycore.distributed.shm import mode_for
from anycore.layers.forward_batch import ForwardBatch

log = logging.getLogger("anycore")

BATCH_FIELDS = ("input_ids", "positions", "slot_mapping", "q_start_loc", "seq_lens", "slot_table", "logits_indices")


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker process needs: the engine config, its rank and the rendezvous address."""

    config: dict[str, Any]
    rank: int
    world: int
    addr: str
    placement: Placement
    parent_pid: int | None = None  # exit when this process goes away (a local worker)

    def to_json(self) -> str:
        d = dict(self.__dict__)
        d["placement"] = dict(self.placement.__dict__)
        return json.dumps(d)

    @staticmethod
    def from_json(text: str) -> WorkerSpec:
        d = json.loads(text)
        p = d.pop("placement")
        return WorkerSpec(placement=Placement(p["rank"], p["local_rank"], tuple(p["cores"]), p["threads"]), **d)


def batch_arrays(batch: ForwardBatch) -> dict[str, np.ndarray]:
    return {name: getattr(batch, name).numpy() for name in BATCH_FIELDS}


def load_shard(config: EngineConfig, group: ParallelGroup, max_len: int):
    """Loads the checkpoint and keeps this rank's share; returns (model, model config, KV heads)."""
    from anycore.kernels.dispatch import select_ops
    from anycore.layers.parallel import shard_llama_family
    from anycore.loader import open_model_source
    from anycore.models import build_model

    source = open_model_source(config.model)
    dtype = parse_dtype(config.dtype)
    ops = select_ops(overrides=config.kernels, threads=torch.get_num_threads())
    model = build_model(source.config, ops, dtype, source.weights(dtype), max_len)
    kv_heads = shard_llama_family(model, group)
    return model, source.config, kv_heads


def serve(group: ParallelGroup, config: EngineConfig) -> None:
    from anycore.engine.runner import KVPool

    kind, init = group.broadcast()
    if kind != "init":
        raise RuntimeError(f"expected the init command, got {kind!r}")
    model, mc, kv_heads = load_shard(config, group, init["max_len"])
    kv = KVPool(mc.num_layers, init["num_slots"], kv_heads, mc.head_dim, parse_dtype(config.dtype))
    k_layers, v_layers = list(kv.k.unbind(0)), list(kv.v.unbind(0))
    group.barrier()  # loaded: rank 0 starts serving after this
    log.info("tensor parallel rank %d/%d ready (%d KV heads)", group.rank, group.world, kv_heads)
    with torch.inference_mode():
        while True:
            kind, arg = group.broadcast()
            if kind == "forward":
                t = {name: torch.from_numpy(a) for name, a in arg.items()}
                batch = ForwardBatch(**t, k_cache=k_layers, v_cache=v_layers)
                model(batch)  # (its hidden states are not kept: a logits command carries rank 0's)
            elif kind == "logits":
                model.compute_logits(arg)
            elif kind == "stop":
                return
            else:
                raise RuntimeError(f"unknown command {kind!r}")


def _exit_with_parent(pid: int) -> None:
    """A local worker outlives no rank 0 (e.g. one killed before the rendezvous)."""
    def watch():
        while True:
            if os.getppid() != pid:
                log.error("tensor parallel: rank 0 (pid %d) is gone; exiting", pid)
                os._exit(3)
            time.sleep(1.0)
    threading.Thread(target=watch, name="anycore-parent-watch", daemon=True).start()


def run(spec: WorkerSpec) -> int:
    config = EngineConfig(**spec.config)
    apply_placement(spec.placement)
    if spec.parent_pid is not None:
        _exit_with_parent(spec.parent_pid)
    log.info("tensor parallel %s (pid %d)", spec.placement.describe(), os.getpid())
    group = ParallelGroup(spec.rank, spec.world, spec.addr, config.dist_timeout,
                          mode_for(config.dist_all_reduce, config.nnodes))
    try:
        serve(group, config)
    except RankFailure as e:
        log.error("tensor parallel rank %d stops: %s", spec.rank, e)
        return 2
    finally:
        group.close()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("ANYCORE_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(run(WorkerSpec.from_json(sys.argv[1])))
