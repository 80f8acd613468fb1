"""``--elastic``: the same training under Horovod's elastic mode (``hvd.elastic.run``), so it
keeps going as hosts come and go (run it with ``dtlaunch run --host-discovery-script ...``).

What is committed every ``--commit-every`` steps (and at each epoch's end) is what a checkpoint
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
import torch

from .checkpoint import Position, gather_state, shard_state
from .data import shard_range
from .job import Job


def allreduce_pair(comm: Any, a: float, b: float) -> tuple[float, float]:
    total = comm.allreduce(torch.tensor([a, b], dtype=torch.float64), op=comm.Sum)
    return float(total[0]), float(total[1])


class ElasticTraining:
    """The state Horovod keeps across resets, and the re-sharding after one."""

    def __init__(self, comm: Any, job: Job, matrix: np.ndarray, pos: Position,
                 every: int) -> None:
        self.comm, self.job, self.matrix, self.every = comm, job, matrix, every
        hidden = gather_state(comm, pos.hidden) if pos.hidden is not None else None
        self.state = comm.elastic.TorchState(job.model, job.optimizer,
                                             pos=dataclasses.replace(pos, hidden=None),
                                             hidden=hidden)
        self.state.register_reset_callbacks([self.reshard])

    def reshard(self) -> None:
        """Each rank's streams for the new number of ranks."""
        job = self.job
        job.streams = shard_range(job.config.batch_size, self.comm.rank(), self.comm.size())
        job.train = torch.from_numpy(np.ascontiguousarray(
            self.matrix[:, job.streams.start : job.streams.stop]))
        job.report.active = self.comm.rank() == 0
        job.report.emit(f"elastic: {self.comm.size()} rank(s) from here on",
                        {"event": "elastic_reset", "ranks": self.comm.size()})

    def position(self) -> Position:
        """Where training stands by the last commit (or sync), with this rank's LSTM state."""
        saved: Position = self.state.pos
        hidden = self.state.hidden
        mine = shard_state(hidden, self.job.streams) if hidden is not None else None
        return dataclasses.replace(saved, hidden=mine)

    def commit(self, pos: Position) -> None:
        """Fold the ranks' interval sums into the epoch's and commit everything."""
        loss, tokens = allreduce_pair(self.comm, pos.interval_loss, pos.interval_tokens)
        pos.epoch_loss, pos.epoch_tokens = pos.epoch_loss + loss, pos.epoch_tokens + int(tokens)
        pos.interval_loss, pos.interval_tokens = 0.0, 0
        self.state.hidden = (gather_state(self.comm, pos.hidden) if pos.hidden is not None
                             else None)
        self.state.pos = dataclasses.replace(pos, hidden=None)
        self.state.commit()

    def on_step(self, pos: Position) -> None:
        if pos.step % self.every == 0:
            self.commit(pos)


def run_elastic(comm: Any, job: Job, matrix: np.ndarray, pos: Position,
                args: argparse.Namespace,
                epochs: Callable[[Position, Callable[[Position], None]], Position]) -> Position:
    """Train under ``hvd.elastic.run``; ``epochs(pos, on_step)`` is the fixed-size loop over
    the epochs, returning where it stopped."""
    training = ElasticTraining(comm, job, matrix, pos, args.commit_every)

    def train(state: Any) -> Position:
        return epochs(training.position(), training.on_step)

    end: Position = comm.elastic.run(train)(training.state)
    return end
