"""Per MPI: how long one step's gradient exchange of the PTB small model takes, 2 ranks on this
machine, with the example's MPI settings and with one of them put back to the MPI's default.

The exchange is the one the example's Horovod optimizer does after a backward pass, on real
gradients of a per-rank batch of 20: a Horovod allreduce (sum) of each of the 10 dense tensors
(the 8 MB decoder weight among them) and Horovod's sparse allreduce of the embedding gradient
(two allgathers: the touched rows' indices and values, about 0.6 MB per rank). Each timing starts
after a 1-float allreduce lines the ranks up and ends when both results are in hand.

Variants, alternating run by run (each run its own `dtlaunch run -np 2`, ranks bound to cores):
- `example`: the example's settings (`dtlaunch/examples/ptb_lm/comm.py`, `DEFAULTS`);
- `stock gather`: the same, but `MPIR_CVAR_ALLGATHERV_PIPELINE_MSG_SIZE=32768`, MPICH's own
  default (MPICH then gathers anything from 32 KB up with its pipelined ring). Intel MPI, built
  from MPICH, reads it too; the Open MPIs do not, so for them the two variants are the same run
  twice.

    python bench/ptb_exchange.py [--reps 5] [--iters 80] [--only MPI] [--report]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import sys
import time
from typing import Any

from common import RESULTS, log, md_table, save_raw, timed, write_result
from mpi_compare import BIND, MPIS, mpi_setup, version

PIPELINE = "MPIR_CVAR_ALLGATHERV_PIPELINE_MSG_SIZE"
VARIANTS = {"example": {}, "stock gather": {PIPELINE: "32768"}}
PER_RANK_BATCH = 20


def worker(iters: int) -> None:
    """One rank: real gradients of one step, then `iters` timed exchanges of them."""
    import torch
    import torch.nn.functional as F

    from dtlaunch.examples.ptb_lm.comm import get_comm
    from dtlaunch.examples.ptb_lm.config import CONFIGS
    from dtlaunch.examples.ptb_lm.model import PTBModel

    hvd = get_comm()
    torch.set_num_threads(1)
    torch.manual_seed(hvd.rank())
    cfg = CONFIGS["small"]
    model = PTBModel(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (cfg.num_steps + 1, PER_RANK_BATCH))
    logits, _ = model(tokens[:-1], model.initial_state(PER_RANK_BATCH))
    F.cross_entropy(logits, tokens[1:].reshape(-1), reduction="sum").backward()
    named = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
    dense = [(n, g, g.clone()) for n, g in named if not g.is_sparse]
    sparse = [(n, g) for n, g in named if g.is_sparse]
    parts = {"dense": (dense, []), "gather": ([], sparse), "both": (dense, sparse)}
    times: dict[str, list[float]] = {k: [] for k in parts}
    for i in range(3 * (iters + 10)):  # the parts take turns, so drift hits all alike
        key = list(parts)[i % 3]
        ds, ss = parts[key]
        for _, g, saved in ds:  # the sum doubles them each time: start from the same values
            g.copy_(saved)
        hvd.allreduce(torch.zeros(1), name="line-up")
        start = time.perf_counter()
        handles = [hvd.allreduce_async_(g, name=n, op=hvd.Sum) for n, g, _ in ds]
        gathers = [hvd.mpi_ops.sparse_allreduce_async(g, name=n, op=hvd.Sum) for n, g in ss]
        for h in handles:
            hvd.synchronize(h)
        for gather in gathers:
            gather()
        if i >= 30:  # the first exchanges negotiate each tensor name once
            times[key].append(1e3 * (time.perf_counter() - start))
    if hvd.rank() == 0:
        print("EXCHANGE " + json.dumps({k: statistics.median(v) for k, v in times.items()}),
              flush=True)


def one_run(name: str, python: str, env: dict[str, str], extra: dict[str, str],
            iters: int) -> dict[str, float]:
    argv = [python, "-m", "dtlaunch", "run", "--no-check", "-np", "2", *BIND[name],
            "-x", "OMP_NUM_THREADS=1", *[a for k, v in extra.items() for a in ("-x", f"{k}={v}")],
            python, os.path.abspath(__file__), "--worker", "--iters", str(iters)]
    out = timed(argv, env=env, timeout=600).stdout
    line = next(ln for ln in out.splitlines() if "EXCHANGE " in ln)
    return {k: float(v) for k, v in json.loads(line.split("EXCHANGE ", 1)[1]).items()}


def measure(reps: int, iters: int, mpis: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in mpis:
        setup = mpi_setup(name)
        if setup is None:
            out[name] = {"missing": "no venv"}
            continue
        python, env = setup
        runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
        for rep in range(reps):
            order = list(VARIANTS) if rep % 2 == 0 else list(reversed(VARIANTS))
            for variant in order:
                runs[variant].append(one_run(name, python, env, VARIANTS[variant], iters))
            log(f"  {name} rep {rep + 1}/{reps}: " + "; ".join(
                f"{v}: " + ", ".join(f"{k} {ms:.2f}" for k, ms in runs[v][-1].items())
                for v in VARIANTS) + " (ms)")
        out[name] = {"version": version(name, env), "runs": runs}
    return out


def short_version(text: str) -> str:
    """'mpirun (Open MPI) 4.1.4' -> 'Open MPI 4.1.4'; Intel's banner -> 'Intel MPI 2021.18.1'."""
    ompi = re.search(r"Open MPI\)?\s+(\S+)", text)
    if ompi:
        return f"Open MPI {ompi.group(1)}"
    intel = re.search(r"Intel.*?Version\s+(\S+)", text)
    return f"Intel MPI {intel.group(1)}" if intel else text


def cell(runs: list[dict[str, float]], part: str) -> str:
    xs = [r[part] for r in runs]
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"


def report(res: dict[str, Any], command: str) -> str:
    rows = []
    for got in res.values():
        if "runs" in got:
            ex, stock = got["runs"]["example"], got["runs"]["stock gather"]
            rows.append([short_version(got["version"]), cell(ex, "dense"), cell(ex, "gather"),
                         cell(stock, "gather"), cell(ex, "both"), cell(stock, "both")])
    return "\n".join([
        "## PTB small: one step's gradient exchange, 2 ranks on one machine", "",
        f"Command: `{command}`", "",
        "Milliseconds, the median over the runs of each run's median, with the range. "
        "`dense`: the allreduces of the dense gradients; `gather`: the sparse embedding "
        "gradient's allgathers; `whole`: both, as the example's optimizer does them. "
        "`stock` puts `MPIR_CVAR_ALLGATHERV_PIPELINE_MSG_SIZE` back to MPICH's own 32768 "
        "(MPICH and Intel MPI read it, the Open MPIs do not).", "",
        md_table(["MPI", "dense", "gather", "gather, stock", "whole", "whole, stock"], rows),
        ""])


def main(argv: list[str] | None = None) -> str | None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--iters", type=int, default=80, help="timed exchanges per run")
    parser.add_argument("--only", choices=MPIS, action="append")
    parser.add_argument("--report", action="store_true",
                        help="only write the table again from the last raw results")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.iters)
        return None
    if args.report:
        res = json.loads((RESULTS / "raw" / "ptb_exchange.json").read_text())
        return write_result("ptb_exchange.md", report(res, res.pop("_command")))
    command = "python bench/ptb_exchange.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    res = measure(args.reps, args.iters, tuple(args.only or MPIS))
    save_raw("ptb_exchange", {"_command": command.strip(), **res})
    RESULTS.mkdir(exist_ok=True)
    return write_result("ptb_exchange.md", report(res, command.strip()))


if __name__ == "__main__":
    main()
