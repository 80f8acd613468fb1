"""Checkpoints that resume exactly, with any number of ranks.

A checkpoint holds the weights, the optimizer state and the ``Position``: epoch, step in the
epoch, total steps, the epoch's loss sums so far and the LSTM state of EVERY stream (gathered
from all ranks). Resuming with a different number of ranks re-shards the streams and the
state, so with the same global batch the next update is the one an uninterrupted run makes.
Dropout masks depend only on (seed, step, stream) (see ``model.StreamNoise``), and the learning
rate only on the epoch, so no random-number state is stored.

Rank 0 writes: a temporary file in the same directory, flushed and fsynced, then renamed over
the old checkpoint (and the directory fsynced), so a crash at any moment leaves either the old
checkpoint or the new one, never half a file. Rank 0 alone reads it on resume and broadcasts.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .comm import allreduce_sum, communication_nice
from .data import DataError, write_atomically
from .model import State

if TYPE_CHECKING:
    from .job import Job

FORMAT = 2


@dataclass
class Position:
    """Where training stands, besides the weights: what a checkpoint records."""

    epoch: int = 0  # 0-based
    epoch_step: int = 0  # steps of ``epoch`` already done
    step: int = 0  # steps since training began, over all epochs and attempts
    epoch_loss: float = 0.0  # global sums over the epoch's finished log intervals
    epoch_tokens: int = 0
    interval_loss: float = 0.0  # THIS rank's sums since the last log line
    interval_tokens: int = 0
    hidden: State | None = None  # THIS rank's LSTM state mid-epoch (None: epoch start)
    train_ppl: float = math.nan  # of the last epoch trained
    valid_ppl: float = math.nan  # after the last finished epoch

    def fold(self, loss: float, tokens: float) -> None:
        """Add the ranks' summed interval to the epoch's sums and start a new interval."""
        self.epoch_loss, self.epoch_tokens = self.epoch_loss + loss, self.epoch_tokens + int(tokens)
        self.interval_loss, self.interval_tokens = 0.0, 0


def next_epoch(pos: Position) -> Position:
    return Position(epoch=pos.epoch + 1, step=pos.step, train_ppl=pos.train_ppl,
                    valid_ppl=pos.valid_ppl)


# ---------------------------------------------------------------- the LSTM state of all streams


def gather_state(comm: Any, state: State) -> State:
    """Every stream's state, in stream order (``(layers, global batch, hidden)``); the ranks'
    shares are contiguous and in rank order, so concatenating by rank is stream order."""
    parts = []
    for t in state:
        batch_first = t.detach().permute(1, 0, 2).contiguous()
        parts.append(comm.allgather(batch_first).permute(1, 0, 2).contiguous())
    return parts[0], parts[1]


def shard_state(state: State, streams: range, device: torch.device) -> State:
    return (state[0][:, streams.start : streams.stop].clone().to(device),
            state[1][:, streams.start : streams.stop].clone().to(device))


# ---------------------------------------------------------------- writing


def save_checkpoint(job: Job, pos: Position, path: str) -> float:
    """Collective (every rank calls it at the same step); rank 0 writes. Returns the seconds
    rank 0 spent writing (0 elsewhere)."""
    loss, tokens = allreduce_sum(job.comm, [pos.interval_loss, pos.interval_tokens])
    hidden = gather_state(job.comm, pos.hidden) if pos.hidden is not None else None
    if job.comm.rank() != 0:
        return 0.0
    started = time.perf_counter()
    record = {f.name: getattr(pos, f.name) for f in dataclasses.fields(pos)}
    record.update(interval_loss=loss, interval_tokens=int(tokens), hidden=hidden)
    payload = {
        "format": FORMAT, "config": dataclasses.asdict(job.config), "seed": job.seed,
        "ranks": job.comm.size(), "position": record,
        "model": job.model.state_dict(), "optimizer": job.optimizer.state_dict(),
    }
    try:
        write_atomically(Path(path), lambda handle: torch.save(payload, handle))
    except OSError as exc:
        raise DataError(f"cannot write checkpoint {path}: {exc.strerror or exc}") from None
    return time.perf_counter() - started


# ---------------------------------------------------------------- reading and resuming


def read_checkpoint(job: Job, path: str) -> dict[str, Any]:
    """Load ``path`` into rank 0's model and optimizer; returns the position record."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # any unreadable file: one line, never a traceback
        raise DataError(f"cannot resume from {path}: {exc}".splitlines()[0]) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise DataError(f"cannot resume from {path}: not a checkpoint of this version "
                        f"(format {state.get('format') if isinstance(state, dict) else '?'})")
    try:
        ours = dataclasses.asdict(job.config)
        for key, value in state["config"].items():
            if ours.get(key) != value:
                raise DataError(f"cannot resume from {path}: it was written with {key} {value}, "
                                f"this run has {ours.get(key)}; give the same options")
        if state["seed"] != job.seed:
            raise DataError(f"cannot resume from {path}: it was written with --seed "
                            f"{state['seed']}")
        job.model.load_state_dict(state["model"])
        job.optimizer.load_state_dict(state["optimizer"])
        record: dict[str, Any] = dict(state["position"])
        record["ranks_before"] = int(state["ranks"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise DataError(f"cannot resume from {path}: damaged checkpoint ({exc})"
                        .splitlines()[0]) from None
    return record


def resume(job: Job, path: str, mode: str | None) -> tuple[Position, dict[str, Any]] | None:
    """Collective. ``mode`` 'required': the checkpoint must exist; 'auto': resume if it does;
    None: only check that it can be written (every rank fails alike if not). Returns this
    rank's position and what rank 0 read (``ranks_before``, ``load_s``), or None to start from
    the beginning. The caller then broadcasts rank 0's weights and optimizer state."""
    comm = job.comm
    outcome: tuple[dict[str, Any] | None, str | None] = (None, None)
    if comm.rank() == 0:
        try:
            # Fail at the start, not after hours of training, when it cannot be written.
            directory = Path(path).parent
            if not directory.is_dir():
                raise DataError(f"--checkpoint {path}: directory {directory} does not exist")
            if not os.access(directory, os.W_OK | os.X_OK):
                raise DataError(f"--checkpoint {path}: cannot write in {directory}")
            if mode is not None and Path(path).is_file():
                started = time.perf_counter()
                record = read_checkpoint(job, path)
                record["load_s"] = time.perf_counter() - started
                outcome = (record, None)
            elif mode == "required":
                raise DataError(f"--resume: no checkpoint at {path} (--resume auto starts "
                                "from the beginning when there is none)")
        except DataError as exc:
            outcome = (None, str(exc))
    record, error = comm.broadcast_object(outcome, root_rank=0)
    if error is not None:  # every rank fails alike instead of waiting for rank 0
        raise DataError(error)
    if record is None:
        return None
    fields = {f.name for f in dataclasses.fields(Position)}
    pos = Position(**{k: v for k, v in record.items() if k in fields})
    if record["hidden"] is not None:  # read onto the CPU
        pos.hidden = shard_state(record["hidden"], job.streams, job.device)
    if comm.rank() != 0:  # the saved interval sums are global: count them once
        pos.interval_loss, pos.interval_tokens = 0.0, 0
    return pos, {"ranks_before": record["ranks_before"], "load_s": record["load_s"]}


def checkpoint(job: Job, pos: Position, path: str) -> None:
    """Every rank calls this at the same step (it gathers the LSTM state); rank 0 writes."""
    seconds = save_checkpoint(job, pos, path)
    where = (f"end of epoch {pos.epoch}" if pos.epoch_step == 0
             else f"epoch {pos.epoch + 1} step {pos.epoch_step}")
    job.report.emit(
        f"checkpoint at {where} ({pos.step} steps) written in {seconds:.2f}s",
        {"event": "checkpoint", "epoch": pos.epoch + 1, "epoch_step": pos.epoch_step,
         "step": pos.step, "seconds": seconds})


def restart_count() -> int | None:
    """``DTLAUNCH_RESTART_COUNT`` as set by ``dtlaunch run --max-restarts``: logged only;
    whether to resume is decided by --resume, never by this."""
    try:
        return int(os.environ["DTLAUNCH_RESTART_COUNT"])
    except (KeyError, ValueError):
        return None


def start(args: argparse.Namespace, job: Job, timing: dict[str, Any]) -> Position:
    """Resume or start afresh, then give every rank rank 0's weights and optimizer state.
    ``timing`` (when the ranks came up, how long the data took) goes into the start record."""
    comm, cfg = job.comm, job.config
    began = time.perf_counter()
    resumed = resume(job, args.checkpoint, args.resume) if args.checkpoint else None
    comm.broadcast_parameters(job.model.state_dict(), root_rank=0)
    comm.broadcast_optimizer_state(job.optimizer, root_rank=0)
    restarts = restart_count()
    niced = communication_nice()
    backend = str(getattr(comm, "label", "horovod"))  # horovod.torch has no label
    job.report.emit(
        f"config {cfg.name}: {comm.size()} rank(s) ({backend}) on {job.device.type}, "
        f"global batch {cfg.batch_size}, {torch.get_num_threads()} thread(s) per rank"
        + (f", communication threads at nice {'/'.join(map(str, niced))}" if niced else "")
        + (f", restart {restarts}" if restarts else ""),
        {"event": "start", "config": cfg.name, "ranks": comm.size(),
         "backend": backend, "device": str(job.device),
         "batch_size": cfg.batch_size, "threads": torch.get_num_threads(),
         "comm_nice": niced, "restart_count": restarts, **timing})
    if resumed is None:
        if args.resume:
            job.report.emit(f"no checkpoint at {args.checkpoint}: starting from the beginning",
                            {"event": "fresh_start"})
        return Position()
    pos, info = resumed
    job.report.emit(
        f"resumed from {args.checkpoint}: epoch {pos.epoch + 1} step {pos.epoch_step} "
        f"({pos.step} steps done), written by {info['ranks_before']} rank(s); read in "
        f"{info['load_s']:.2f}s, ready in {time.perf_counter() - began:.2f}s",
        {"event": "resume", "epoch": pos.epoch + 1, "epoch_step": pos.epoch_step,
         "step": pos.step, "ranks_before": info["ranks_before"], "ranks": comm.size(),
         "load_s": info["load_s"], "ready_s": time.perf_counter() - began})
    return pos
