"""``--elastic``: the same training under Horovod's elastic mode (``hvd.elastic.run``), so it
keeps going as hosts come and go (run it with ``dtlaunch run --host-discovery-script ...``).

What is committed every ``--commit-every`` steps is what a checkpoint
holds: the weights and optimizer state (``TorchState``), the ``Position`` and the LSTM state of
EVERY stream (gathered from all ranks). After a reset each rank takes its share of the streams
for the new number of ranks, and their state, from rank 0's commit: dropout depends only on
(seed, step, stream) and the gradients are summed with each rank's scaled by 1 / global batch,
so the updates are the ones a fixed-size run makes. A failed rank's steps since the last commit
are done again, from the commit. Only the log lines differ: at a commit the ranks fold their
since-the-last-line sums into the epoch's.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from .checkpoint import Position, gather_state, shard_state
from .comm import allreduce_sum
from .data import shard_range
from .job import Job, columns


def run_elastic(job: Job, matrix: np.ndarray, args: argparse.Namespace, timing: dict[str, Any],
                epochs: Callable[[Position, Callable[[Position], None]], Position]) -> Position:
    """Train from the beginning under ``hvd.elastic.run`` on ``matrix`` (every stream's column:
    a reset shares it out again); ``epochs(pos, on_step)`` is the fixed-size loop over the
    epochs, returning where it stopped. ``timing`` goes into the start record."""
    comm, cfg = job.comm, job.config
    job.report.emit(f"config {cfg.name}: elastic, {comm.size()} rank(s) to start with, "
                    f"global batch {cfg.batch_size}",
                    {"event": "start", "config": cfg.name, "ranks": comm.size(),
                     "batch_size": cfg.batch_size, "elastic": True, **timing})
    # What Horovod keeps across resets.
    state = comm.elastic.TorchState(job.model, job.optimizer, pos=Position(), hidden=None)

    def reshard() -> None:
        """Each rank's streams for the new number of ranks."""
        job.streams = shard_range(job.config.batch_size, comm.rank(), comm.size())
        job.train = columns(matrix, job.streams, job.device)
        job.report.active = comm.rank() == 0
        job.report.emit(f"elastic: {comm.size()} rank(s) from here on",
                        {"event": "elastic_reset", "ranks": comm.size()})

    def on_step(pos: Position) -> None:
        """Every ``--commit-every`` steps: fold the ranks' interval sums into the epoch's and
        commit everything."""
        if pos.step % args.commit_every != 0:
            return
        pos.fold(*allreduce_sum(comm, [pos.interval_loss, pos.interval_tokens]))
        state.hidden = gather_state(comm, pos.hidden) if pos.hidden is not None else None
        state.pos = dataclasses.replace(pos, hidden=None)
        state.commit()

    def train(state: Any) -> Position:
        """From the last commit (or sync), with this rank's share of the LSTM state."""
        mine = shard_state(state.hidden, job.streams, job.device) if state.hidden is not None else None
        return epochs(dataclasses.replace(state.pos, hidden=mine), on_step)

    state.register_reset_callbacks([reshard])
    end: Position = comm.elastic.run(train)(state)
    return end
