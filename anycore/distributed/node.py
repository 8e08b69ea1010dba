"""A node other than node 0 (``anycore serve --nnodes N --node-rank K``, K > 0): starts this
host's worker ranks, which join node 0's rendezvous at ``--dist-init-addr``, and waits for them.

Node K holds ranks ``K * (tp / nnodes) ..`` of the group; node 0's process is rank 0 (the
server). The exit status is the worst worker's: 0 after rank 0's stop command, non-zero when
the group failed (e.g. node 0 went away: the workers see the closed connection).
"""

from __future__ import annotations

import logging

from anycore.config import EngineConfig
from anycore.distributed.driver import spawn_local_ranks

log = logging.getLogger("anycore")


def run_node(config: EngineConfig) -> int:
    local_world = config.tensor_parallel_size // config.nnodes
    first = config.node_rank * local_world
    log.info("node %d of %d: ranks %d..%d of %d, rendezvous at %s", config.node_rank, config.nnodes, first,
             first + local_world - 1, config.tensor_parallel_size, config.dist_init_addr)
    workers = spawn_local_ranks(config, config.dist_init_addr, first, local_world, skip_first=False)
    codes = [proc.wait() for _, proc in workers]
    for (p, _), code in zip(workers, codes):
        (log.info if code == 0 else log.error)("tensor parallel rank %d exited with code %d", p.rank, code)
    return max(codes, default=0)
