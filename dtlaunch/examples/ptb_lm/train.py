"""Train the PTB LSTM language model, one process or many under Horovod or torch.distributed.

Plain Horovod script: ``mpirun -np 2 python -m dtlaunch.examples.ptb_lm --config small``; with
``--backend ddp``, a plain DistributedDataParallel script for ``torchrun``.
``--batch-size`` (default from the config) is the GLOBAL number of streams; each rank trains
on its contiguous share (see ``data.py``) and Horovod sums the gradients each rank scaled by
1 / global batch, so the update equals the single-process update on the whole batch. The
learning rate is not scaled.

Evaluation (validation each epoch, test at the end) covers every target token of the split
once: the split is cut into ``--eval-batch-size`` streams (default 10) read ``num_steps``
tokens at a time, the streams are shared out over the ranks, and summed losses and token
counts are allreduced, so perplexity = exp(total loss / total tokens) exactly. (The TF tutorial
tests with batch 1; more streams only reset the LSTM state at stream starts.)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .checkpoint import Position, checkpoint, next_epoch, start
from .comm import COMM_NICE, allreduce_sum, get_comm
from .config import CONFIGS, Config, learning_rate
from .data import (
    IGNORE_INDEX,
    SPLITS,
    Corpus,
    DataError,
    eval_streams,
    load_corpus,
    shard_range,
    stream_matrix,
)
from .ddp import SetupError, TorchDistributed, choose_device, torchrun_placement
from .job import Job, Reporter, columns
from .memory import keep_freed_memory
from .model import PTBModel, State, StreamNoise
from .optim import PlainSGD


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dtlaunch.examples.ptb_lm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=sorted(CONFIGS), default="small")
    p.add_argument("--backend", choices=("horovod", "ddp"), default="horovod",
                   help="horovod (default; one plain process without Horovod) or ddp: "
                        "DistributedDataParallel over Gloo on CPUs, NCCL on GPUs, ranks from "
                        "torchrun's environment (torchrun, dtlaunch run --torch)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="cuda: one GPU per local rank; auto (default): cuda where PyTorch sees "
                        "a GPU, else cpu")
    p.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help="start no epoch that would end after SECONDS from the start (judged by "
                        "the longest epoch so far); the test perplexity is still computed")
    p.add_argument("--data-path", default="./data/ptb",
                   help="directory with ptb.{train,valid,test}.txt (downloaded if absent)")
    p.add_argument("--max-epochs", type=int, help="epochs to train (default: the config's)")
    p.add_argument("--max-steps", type=int, help="stop after this many training steps")
    p.add_argument("--batch-size", type=int, help="GLOBAL streams per step (default: config)")
    p.add_argument("--eval-batch-size", type=int, default=10, help="GLOBAL eval streams")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int,
                   help="torch threads per rank (default: CPUs / ranks on this host)")
    p.add_argument("--log-interval", type=int, help="steps between reports (default: epoch/10)")
    p.add_argument("--metrics", help="JSON-lines metrics file (rank 0)")
    p.add_argument("--hidden-size", type=int, help="LSTM and embedding size (default: config)")
    p.add_argument("--keep-prob", type=float, help="1 - dropout (default: config)")
    p.add_argument("--checkpoint", metavar="FILE",
                   help="written by rank 0 after each epoch, every --checkpoint-every steps and "
                        "where --max-steps stops; on a filesystem the next rank 0 can read")
    p.add_argument("--checkpoint-every", type=int, metavar="K",
                   help="also write the checkpoint every K training steps")
    p.add_argument("--resume", nargs="?", const="required", choices=("required", "auto"),
                   help="continue from --checkpoint with any number of ranks; 'auto': only if "
                        "it exists, else start from the beginning (for dtlaunch --max-restarts)")
    p.add_argument("--dense-grads", action="store_true",
                   help="dense embedding gradients (default sparse: less to exchange)")
    p.add_argument("--no-eval", action="store_true", help="skip validation and test")
    p.add_argument("--comm-nice", type=int, default=COMM_NICE, metavar="N",
                   help="nice value of Horovod's and MPI's threads (0: leave them; default "
                        f"{COMM_NICE}: the exchange waits for the compute threads to leave a "
                        "core instead of taking it from them)")
    p.add_argument("--default-malloc", action="store_true",
                   help="leave glibc's malloc as it is (default: keep freed blocks for the next "
                        "step instead of faulting them in again; see memory.py)")
    p.add_argument("--elastic", action="store_true",
                   help="train under Horovod's elastic mode: go on as hosts come and go (run "
                        "with dtlaunch run --host-discovery-script or --min-np)")
    p.add_argument("--commit-every", type=int, default=20, metavar="K",
                   help="with --elastic: commit the training state every K steps (default 20)")
    p.add_argument("--dump-params", help="each rank writes FILE.rank<r> with a params digest")
    p.add_argument("--dump-shard", help="each rank writes FILE.rank<r> with its streams")
    args = p.parse_args(argv)
    if args.resume and not args.checkpoint:
        p.error("--resume needs --checkpoint FILE")
    if args.checkpoint_every is not None and not args.checkpoint:
        p.error("--checkpoint-every needs --checkpoint FILE")
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        p.error("--checkpoint-every must be at least 1")
    if args.keep_prob is not None and not 0.0 < args.keep_prob <= 1.0:
        p.error("--keep-prob must be in (0, 1]")
    if not 0 <= args.comm_nice <= 19:
        p.error("--comm-nice must be in 0..19")
    if args.hidden_size is not None and args.hidden_size < 1:
        p.error("--hidden-size must be at least 1")
    if args.commit_every < 1:
        p.error("--commit-every must be at least 1")
    if args.elastic and args.backend == "ddp":
        p.error("--elastic is Horovod's elastic mode; it needs --backend horovod")
    if args.time_limit is not None and args.time_limit <= 0:
        p.error("--time-limit must be positive")
    if args.elastic and args.checkpoint:
        p.error("--elastic keeps the training state in memory across resets; --checkpoint is "
                "for restarts of a fixed-size job")
    return args


def shared_corpus(comm: Any, data_path: str) -> Corpus:
    """Rank 0 reads (and if need be downloads) the data and sends it to every rank, so no
    shared filesystem is needed and all ranks fail alike, without hanging, on a data error.

    The vocabulary and the splits' lengths go as one small object; the id arrays go as
    tensors. Horovod's broadcast_object turns its pickle into a tensor byte by byte in
    Python, which made the 8 MB of ids cost 1-4 s of every (re)start."""
    corpus: Corpus | None = None
    error: str | None = None
    if comm.rank() == 0:
        try:
            corpus = load_corpus(data_path)
        except DataError as exc:
            error = str(exc)
    head = (None, error) if corpus is None else (
        (corpus.words, [len(getattr(corpus, s)) for s in SPLITS]), None)
    shape, error = comm.broadcast_object(head, root_rank=0, name="corpus.head")
    if error is not None or shape is None:
        raise DataError(error or "no data")
    words, lengths = shape
    arrays = {}
    for split, length in zip(SPLITS, lengths):
        if corpus is not None:
            ids = torch.from_numpy(np.ascontiguousarray(getattr(corpus, split), dtype=np.int64))
        else:
            ids = torch.empty(length, dtype=torch.int64)
        arrays[split] = comm.broadcast_(ids, root_rank=0, name=f"corpus.{split}").numpy()
    return Corpus(words=words, **arrays)


def detach(state: State) -> State:
    return state[0].detach(), state[1].detach()


def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float) -> None:
    """Scale gradients to a global norm of at most ``max_norm`` (as ``clip_grad_norm_``, which
    rejects sparse gradients). Sparse ones are coalesced first: Horovod's allgather lists a
    row once per rank that touched it, and the norm must be taken over the summed rows."""
    grads = []
    for p in params:
        if p.grad is not None and p.grad.is_sparse:
            p.grad = p.grad.coalesce()
            grads.append(p.grad._values())
        elif p.grad is not None:
            grads.append(p.grad)
    norms = torch.stack([torch.linalg.vector_norm(g) for g in grads])
    if norms.is_cuda:
        # The same scaling without reading the norm back: a read would wait for the GPU every
        # step, so the CPU could not queue the next step's kernels meanwhile.
        scale = (max_norm / (torch.linalg.vector_norm(norms) + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(scale)
        return
    total = float(torch.linalg.vector_norm(norms))
    if total > max_norm:
        for g in grads:
            g.mul_(max_norm / (total + 1e-6))


def clipped_step(optimizer: Any, params: Sequence[torch.Tensor], max_norm: float) -> None:
    """Clip the AVERAGED gradient: finish Horovod's allreduce first, then clip, then step."""
    horovod = hasattr(optimizer, "synchronize")  # else a plain optimizer (one process, DDP)
    if horovod:
        optimizer.synchronize()
    clip_grad_norm(params, max_norm)
    with optimizer.skip_synchronize() if horovod else contextlib.nullcontext():
        optimizer.step()


@dataclass
class Progress:
    """This attempt's throughput (a resumed run reports its own speed)."""

    words: int = 0  # global words trained
    seconds: float = 0.0


def train_epoch(job: Job, pos: Position, lr: float, args: argparse.Namespace,
                progress: Progress, on_step: Callable[[Position], None] | None = None) -> bool:
    """Train ``pos.epoch`` from ``pos.epoch_step`` to its end (or until --max-steps),
    updating ``pos`` as it goes; returns whether the epoch was completed."""
    cfg, model, T = job.config, job.model, job.config.num_steps
    net = job.net if job.net is not None else job.model
    for group in job.optimizer.param_groups:
        group["lr"] = lr
    net.train()  # DDP passes it on to the model
    params = list(model.parameters())
    n_steps = (job.train.shape[0] - 1) // T  # a stream's last token is only a target
    interval = args.log_interval or max(1, n_steps // 10)
    global_batch = cfg.batch_size
    state = pos.hidden if pos.hidden is not None else model.initial_state(job.train.shape[1])
    start = tick = time.perf_counter()
    ticked_at = pos.epoch_step
    completed = True
    # This rank's loss since the last log line, summed where it is computed (in float64, as
    # the float it replaces): reading it every step would make a GPU step wait for the last.
    pending = torch.tensor(pos.interval_loss, dtype=torch.float64, device=job.device)
    for i in range(pos.epoch_step, n_steps):
        if args.max_steps is not None and pos.step >= args.max_steps:
            completed = False
            break
        inputs = job.train[i * T : (i + 1) * T]
        targets = job.train[i * T + 1 : (i + 1) * T + 1].reshape(-1)
        noise = StreamNoise(job.seed, pos.step, job.streams, global_batch)
        logits, state = net(inputs, detach(state), noise)
        loss_sum = F.cross_entropy(logits, targets, reduction="sum")
        job.optimizer.zero_grad()
        (loss_sum * job.loss_scale).backward()
        clipped_step(job.optimizer, params, cfg.max_grad_norm)
        pending += loss_sum.detach()
        pos.interval_tokens += targets.numel()
        pos.step, pos.epoch_step, pos.hidden = pos.step + 1, i + 1, detach(state)
        progress.words += global_batch * T
        report = (i + 1) % interval == 0
        save = bool(args.checkpoint_every) and pos.step % args.checkpoint_every == 0
        if not (report or save or on_step is not None):
            continue
        pos.interval_loss = float(pending)
        if report:
            loss, tokens = allreduce_sum(job.comm, [pos.interval_loss, pos.interval_tokens])
            now = time.perf_counter()
            words_per_sec = (i + 1 - ticked_at) * global_batch * T / (now - tick)
            job.report.emit(
                f"epoch {pos.epoch + 1} step {i + 1}/{n_steps} ppl {math.exp(loss / tokens):.2f} "
                f"words/s {words_per_sec:,.0f} lr {lr:.4g}",
                {"event": "progress", "epoch": pos.epoch + 1, "epoch_step": i + 1,
                 "step": pos.step, "words_per_sec": words_per_sec,
                 "train_ppl": math.exp(loss / tokens), "lr": lr},
            )
            pos.fold(loss, tokens)
            tick, ticked_at = now, i + 1
        if save:
            checkpoint(job, pos, args.checkpoint)
        if on_step is not None:
            on_step(pos)
        pending.fill_(pos.interval_loss)  # the report and an elastic commit clear it
    pos.interval_loss = float(pending)
    loss, tokens = allreduce_sum(job.comm, [pos.interval_loss, pos.interval_tokens])
    pos.train_ppl = math.exp((pos.epoch_loss + loss) / max(pos.epoch_tokens + tokens, 1))
    if completed:
        pos.fold(loss, tokens)
    progress.seconds += time.perf_counter() - start
    return completed


@torch.no_grad()
def evaluate(job: Job, ids: np.ndarray, num_streams: int) -> float:
    """Perplexity over every target of ``ids``; streams are shared out over the ranks."""
    inputs, targets = eval_streams(ids, num_streams)
    mine = shard_range(num_streams, job.comm.rank(), job.comm.size(), allow_empty=True)
    x, y = columns(inputs, mine, job.device), columns(targets, mine, job.device)
    job.model.eval()
    T = job.config.num_steps
    loss = torch.zeros((), dtype=torch.float64, device=job.device)  # float64, as a float sum
    if len(mine) > 0:
        state = job.model.initial_state(len(mine))
        for t in range(0, x.shape[0], T):
            logits, state = job.model(x[t : t + T], state)
            loss += F.cross_entropy(logits, y[t : t + T].reshape(-1), reduction="sum",
                                    ignore_index=IGNORE_INDEX)
    tokens = int((y != IGNORE_INDEX).sum())
    total_loss, total_tokens = allreduce_sum(job.comm, [float(loss), tokens])
    return math.exp(total_loss / total_tokens)


def write_rank_file(prefix: str, rank: int, record: dict[str, Any]) -> None:
    Path(f"{prefix}.rank{rank}").write_text(json.dumps(record) + "\n")


def dump_params(prefix: str, rank: int, model: PTBModel) -> None:
    """``PREFIX.rank<r>``: digest of the flat parameters; ``PREFIX.rank<r>.pt``: the tensor."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    torch.save(flat, f"{prefix}.rank{rank}.pt")
    write_rank_file(prefix, rank, {"sha256": hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
            "numel": flat.numel(), "sum": float(flat.double().sum())})


def run_config(args: argparse.Namespace, vocab_size: int) -> Config:
    """The --config's hyper-parameters with the options that override them."""
    overrides = {"batch_size": args.batch_size, "hidden_size": args.hidden_size,
                 "keep_prob": args.keep_prob}
    return replace(CONFIGS[args.config], vocab_size=vocab_size,
                   **{k: v for k, v in overrides.items() if v is not None})


def build_job(args: argparse.Namespace, comm: Any, config: Config, matrix: np.ndarray,
              device: torch.device) -> Job:
    """The model, optimizer and this rank's share of ``matrix``'s streams."""
    streams = shard_range(config.batch_size, comm.rank(), comm.size())
    torch.manual_seed(args.seed)
    # Sparse embedding gradients pay on CPUs (see model.py); on a GPU the dense 10,000-row
    # update is one cheap kernel, and NCCL reduces no sparse tensors.
    sparse = not args.dense_grads and device.type == "cpu"
    model = PTBModel(config, sparse=sparse).to(device)  # initialised on the CPU: same weights
    net = comm.wrap(model) if hasattr(comm, "wrap") else None
    # Horovod SUMS the ranks' gradients: each rank has already scaled its own by 1 / global
    # batch (below), so the sum is the global average. Horovod's average would cost one more
    # pass over the 10.5 MB of dense gradients every step: about 1 % of a step on 2 ranks.
    optimizer = comm.DistributedOptimizer(
        PlainSGD(model.parameters(), lr=config.learning_rate),
        named_parameters=model.named_parameters(), op=comm.Sum,
    )
    # The TF tutorial's cost (which lr 1.0 and clip 5 are tuned for) is the loss SUMMED over
    # the num_steps time steps and averaged over the batch. Each rank sums its own token losses
    # and scales by 1 / global batch: the sum over ranks then equals that global cost even
    # when the ranks' shares of streams differ.
    # DDP AVERAGES over the ranks instead of summing: scaling by size / global batch makes
    # its average the same global cost.
    averages = getattr(comm, "averages_gradients", False)
    loss_scale = (comm.size() if averages else 1.0) / config.batch_size
    return Job(comm=comm, config=config, model=model, optimizer=optimizer,
               train=columns(matrix, streams, device), streams=streams,
               loss_scale=loss_scale, report=Reporter(comm.rank() == 0, args.metrics),
               seed=args.seed, net=net, device=device)


def run(args: argparse.Namespace, comm: Any, up_at: float, device: torch.device) -> None:
    began = time.perf_counter()
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // int(comm.local_size())))
    loading = time.perf_counter()
    # Elastic: a worker that joins later runs this alone, so nothing here may wait for the
    # others (each reads the data itself; the state comes from rank 0 at the first sync).
    corpus = load_corpus(args.data_path) if args.elastic else shared_corpus(comm, args.data_path)
    timing = {"up_at": up_at, "data_s": time.perf_counter() - loading}
    cfg = run_config(args, len(corpus.words))
    matrix = stream_matrix(corpus.train, cfg.batch_size)  # every stream's column
    job = build_job(args, comm, cfg, matrix, device)
    if args.dump_shard:
        write_rank_file(args.dump_shard, comm.rank(), {
            "rank": comm.rank(), "size": comm.size(), "streams": list(job.streams),
            "first_tokens": job.train[:8].T.tolist()})

    progress, epoch_times = Progress(), []
    epoch_walls: list[float] = []  # whole epochs with their validation, for --time-limit
    max_epochs = args.max_epochs if args.max_epochs is not None else cfg.max_max_epoch

    def epochs(pos: Position, on_step: Callable[[Position], None] | None = None) -> Position:
        while pos.epoch < max_epochs:
            if args.max_steps is not None and pos.step >= args.max_steps:
                break
            if out_of_time(args.time_limit, time.perf_counter() - began, epoch_walls):
                job.report.emit(
                    f"time limit: {pos.epoch} epoch(s) done; the next would end after "
                    f"{args.time_limit:.0f}s", {"event": "time_limit", "epochs": pos.epoch})
                break
            lr = learning_rate(cfg, pos.epoch)
            whole, started = pos.epoch_step == 0, time.perf_counter()
            if not train_epoch(job, pos, lr, args, progress, on_step):
                if args.checkpoint and not (args.checkpoint_every
                                            and pos.step % args.checkpoint_every == 0):
                    checkpoint(job, pos, args.checkpoint)  # where --max-steps stopped
                break
            epoch_time = time.perf_counter() - started
            if whole:  # an epoch begun by an earlier attempt has no meaningful time
                epoch_times.append(epoch_time)
            if not args.no_eval:
                pos.valid_ppl = evaluate(job, corpus.valid, args.eval_batch_size)
            job.report.emit(
                f"epoch {pos.epoch + 1} done: lr {lr:.4g} train ppl {pos.train_ppl:.2f} "
                f"valid ppl {pos.valid_ppl:.2f} time {epoch_time:.1f}s",
                {"event": "epoch", "epoch": pos.epoch + 1, "lr": lr, "train_ppl": pos.train_ppl,
                 "valid_ppl": pos.valid_ppl, "epoch_time_s": epoch_time})
            epoch_walls.append(time.perf_counter() - started)  # with the validation
            pos = next_epoch(pos)
            if args.checkpoint:
                checkpoint(job, pos, args.checkpoint)
        return pos

    if args.elastic:
        from .elastic import run_elastic

        pos = run_elastic(job, matrix, args, timing, epochs)
    else:
        pos = epochs(start(args, job, timing))

    test_ppl = float("nan") if args.no_eval else evaluate(
        job, corpus.test, args.eval_batch_size)
    if args.dump_params:
        dump_params(args.dump_params, comm.rank(), job.model)
    words_per_sec = progress.words / progress.seconds if progress.seconds else 0.0
    mean_epoch = sum(epoch_times) / len(epoch_times) if epoch_times else float("nan")
    job.report.emit(
        f"final: train ppl {shown(pos.train_ppl)} valid ppl {shown(pos.valid_ppl)} "
        f"test ppl {shown(test_ppl)} steps {pos.step} "
        f"epoch time {shown(mean_epoch, 1, 's')} words/s {words_per_sec:,.0f}",
        {"event": "final", "train_ppl": pos.train_ppl, "valid_ppl": pos.valid_ppl,
         "test_ppl": test_ppl, "steps": pos.step, "epoch_time_s": mean_epoch,
         "words_per_sec": words_per_sec})


def out_of_time(limit: float | None, elapsed: float, epoch_walls: Sequence[float]) -> bool:
    """Whether another epoch, as long as the longest so far, would end after ``limit``."""
    return limit is not None and bool(epoch_walls) and elapsed + max(epoch_walls) > limit


def shown(value: float, digits: int = 2, unit: str = "") -> str:
    """A number for the summary line; '-' where nothing was measured (e.g. no full epoch)."""
    return "-" if math.isnan(value) else f"{value:.{digits}f}{unit}"


LEAVE_AT_ONCE = [False]  # set once a torch.distributed run has finished and shut down


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.default_malloc:
        keep_freed_memory()  # before anything large is allocated
    try:
        comm, device = connect(args)
    except SetupError as exc:  # every rank meets it alike, before any collective
        print(f"ptb_lm: error: {exc}", file=sys.stderr, flush=True)
        return 2
    if args.elastic and not hasattr(comm, "elastic"):
        print("ptb_lm: error: --elastic needs Horovod (horovod.torch)", file=sys.stderr)
        return 2
    up_at = time.time()  # modules imported and Horovod initialised: for recovery timings
    finished = False
    try:
        run(args, comm, up_at, device)
        finished = True
    except DataError as exc:
        if comm.rank() == 0:
            print(f"ptb_lm: error: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        if isinstance(comm, TorchDistributed):
            comm.shutdown(finished)
            # `python -m` leaves without the interpreter's teardown (__main__.py): after ~100
            # DDP steps on Gloo, a thread of torch's still joinable there ends the process
            # with SIGABRT ("terminate called without an active exception").
            LEAVE_AT_ONCE[0] = finished
    return 0


def connect(args: argparse.Namespace) -> tuple[Any, torch.device]:
    """The initialised communication (Horovod, its stand-in, or torch.distributed) and this
    rank's device: one GPU per local rank."""
    if args.backend == "ddp":
        _, _, local_rank, local_size = torchrun_placement(os.environ)
        device = choose_device(args.device, torch.cuda.is_available(), torch.cuda.device_count(),
                               local_rank, local_size)
        comm = get_comm(args.comm_nice, TorchDistributed(device, local_rank, local_size))
    else:
        comm = get_comm(args.comm_nice)
        device = choose_device(args.device, torch.cuda.is_available(), torch.cuda.device_count(),
                               comm.local_rank(), comm.local_size())
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
    return comm, torch.device(device)
