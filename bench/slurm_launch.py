"""Inside one Slurm allocation on the test bed: dtlaunch vs the hand-written mpirun, and the
pre-flight through srun vs the pre-flight over SSH on the same nodes.

A real Slurm cluster (munged, slurmctld, one slurmd per host) runs over a 2-host bed; this
script then runs itself once inside `salloc -N2` (`--inside`), where every tool runs in the same
allocation, round-robin:
  launch:   the tiny Horovod job (init + one allreduce, one rank per allocated CPU) started by
            the mpirun line `dtlaunch run --dry-run` prints (pasted by hand: plm slurm, srun
            starts the daemons) and by `dtlaunch run` (no check, pre-flight cache hit, full
            pre-flight every time);
  checks:   `dtlaunch doctor --launcher slurm` (one srun step per node) vs `--launcher ssh`
            (-H the same nodes, the bed's ssh config).

    python bench/slurm_launch.py [--reps 7] [--baseline REV]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    PYTHON,
    ROOT,
    TINY_JOB,
    Sample,
    Series,
    baseline_env,
    baseline_tree,
    bed_of,
    bench_parser,
    command_line,
    dtlaunch_argv,
    fmt_s,
    loadavg,
    log,
    md_table,
    public,
    ratio,
    round_robin,
    timed,
    warm_run,
    worktree_env,
    write_result,
)

GOAL = 1.10
LAUNCH_GOAL_ROW = "dtlaunch run (warm pre-flight, the default)"


def _allocated() -> list[str]:
    from dtlaunch.cluster.allocation import parse_slurm_nodelist

    return list(parse_slurm_nodelist(os.environ["SLURM_JOB_NODELIST"]))


def inside(args: argparse.Namespace) -> dict[str, Any]:
    """Runs inside `salloc -N2`: every tool in this one allocation, round-robin."""
    env = worktree_env()
    cold_env = dict(env, DTLAUNCH_PREFLIGHT_CACHE="0")
    cache = Path(tempfile.mkdtemp(prefix="dtlaunch-bench-cache-"))
    warm_env = dict(env, XDG_CACHE_HOME=str(cache))
    base_cache = Path(tempfile.mkdtemp(prefix="dtlaunch-bench-cache-"))
    run = ["run", "-v", "--iface", args.subnet]
    dry = timed(dtlaunch_argv(*run, "--dry-run", TINY_JOB), env=env)
    mpirun = shlex.split(dry.stdout.strip().splitlines()[-1])
    assert Path(mpirun[0]).name == "mpirun", dry.stdout
    nodes = _allocated()
    doctor = ["doctor", "--iface", args.subnet, TINY_JOB]
    ssh_doctor = [*doctor, "--launcher", "ssh", "-H", ",".join(nodes),
                  "--ssh-config", args.ssh_config]

    def warm(e: dict[str, str]) -> Sample:
        sample, missed = warm_run(lambda: timed(dtlaunch_argv(*run, TINY_JOB), env=e),
                                  e["XDG_CACHE_HOME"], fill=True)
        if missed:
            log("  warm pre-flight missed its cache")
        return sample

    launch = {
        "mpirun (the --dry-run line)": lambda: timed(mpirun, env=env),
        "dtlaunch run --no-check": lambda: timed(dtlaunch_argv(*run, "--no-check", TINY_JOB), env=env),
        LAUNCH_GOAL_ROW: lambda: warm(warm_env),
        "dtlaunch run (full pre-flight)": lambda: timed(dtlaunch_argv(*run, TINY_JOB), env=cold_env),
    }
    checks = {
        "doctor --launcher slurm": lambda: timed(dtlaunch_argv(*doctor, "--launcher", "slurm"),
                                                 env=env, check=False),
        "doctor --launcher ssh": lambda: timed(dtlaunch_argv(*ssh_doctor), env=env, check=False),
    }
    if args.base:
        b_env = baseline_env(args.base)
        b_warm = dict(b_env, XDG_CACHE_HOME=str(base_cache))
        launch[f"dtlaunch @{args.rev} (warm pre-flight)"] = lambda: warm(b_warm)
        launch[f"dtlaunch @{args.rev} (full pre-flight)"] = lambda: timed(
            dtlaunch_argv(*run, TINY_JOB), env=dict(b_env, DTLAUNCH_PREFLIGHT_CACHE="0"))
        checks[f"doctor @{args.rev} --launcher slurm"] = lambda: timed(
            dtlaunch_argv(*doctor, "--launcher", "slurm"), env=b_env, check=False)
    try:
        load0 = loadavg()
        launched = round_robin(launch, args.reps, warmup=1, label="launch")
        load1 = loadavg()
        checked = round_robin(checks, args.reps, warmup=1, label="checks")
        load2 = loadavg()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(base_cache, ignore_errors=True)
    for name, s in checked.items():
        codes = {x.returncode for x in s.samples}
        if codes != {0}:
            log(f"  {name} exit statuses {sorted(codes)}: {s.samples[-1].stdout[-800:]}")
    return {
        "nodes": nodes, "job": os.environ.get("SLURM_JOB_ID", "?"),
        "mpirun": shlex.join(mpirun), "load": [load0, load1, load2],
        "launch": {n: s.times for n, s in launched.items()},
        "launch_cpu": {n: [x.cpu for x in s.samples] for n, s in launched.items()},
        "checks": {n: s.times for n, s in checked.items()},
        "check_codes": {n: sorted({x.returncode for x in s.samples}) for n, s in checked.items()},
    }


def _series(times: dict[str, list[float]]) -> dict[str, Series]:
    return {n: Series(n, [Sample(t, 0) for t in ts]) for n, ts in times.items()}


def _rows(series: dict[str, Series], base_name: str, goal_rows: tuple[str, ...],
          cpu: dict[str, list[float]] | None = None) -> list[list[str]]:
    base = series[base_name]
    rows = []
    for name, s in series.items():
        r = ratio(s.median, base.median)
        paired = statistics.median(ratio(a, b) for a, b in zip(s.times, base.times))
        goal = ("met" if r <= GOAL else "MISSED") if name in goal_rows else ""
        row = [name, fmt_s(s), f"{r:.2f}", f"{paired:.2f}", f"{s.median - base.median:+.2f}"]
        if cpu is not None:
            row.append(f"{statistics.median(cpu[name]):.2f}" if cpu.get(name) else "–")
        rows.append([*row, goal])
    return rows


def report(res: dict[str, Any], command: str) -> str:
    launch, checks = _series(res["launch"]), _series(res["checks"])
    reps = len(next(iter(res["launch"].values())))
    mpirun_name = next(iter(launch))
    return "\n".join([
        "# Inside a Slurm allocation: dtlaunch vs mpirun, srun pre-flight vs SSH pre-flight", "",
        f"A real Slurm cluster on the test bed (munged, slurmctld, one slurmd per host), all "
        f"tools run one after the other inside the same `salloc -N2` (job {res['job']}, nodes "
        f"{','.join(res['nodes'])}), {reps} repetitions after one warm-up round, the order "
        f"rotating; medians (min–max). Load average (1, 5, 15 min) before / between / after: "
        f"{' / '.join(res['load'])} (a shared 2-core machine: the ratios, measured side by "
        "side, are the figures to read, not the absolute times).", "",
        f"Command, from the repository root, as root: `{command}`", "",
        "## Launch: the tiny Horovod job (init + one allreduce), one rank per allocated CPU", "",
        md_table(["launcher", "wall s, median (min–max)", "× mpirun (medians)",
                  "× mpirun (paired)", "overhead s", "CPU s on the launcher",
                  f"goal ≤ {GOAL:.2f}"],
                 _rows(launch, mpirun_name, (LAUNCH_GOAL_ROW,), res.get("launch_cpu"))), "",
        "CPU s on the launcher: user + system time of the tool and every process it waited for "
        "on the launcher (mpirun, its srun, dtlaunch's own srun steps); not the nodes' slurmd, "
        "orted and ranks. The difference to mpirun's is what dtlaunch itself costs.", "",
        "The mpirun line is the one `dtlaunch run --dry-run` printed inside the allocation, run "
        "as typed:", "", "```", res["mpirun"], "```", "",
        "The warm pre-flight is the default: a successful pre-flight is cached for 5 minutes "
        "(refreshed, untimed, when older than 200 s); the full pre-flight is "
        "`DTLAUNCH_PREFLIGHT_CACHE=0` (every check on every node through srun, every time).", "",
        "## Pre-flight: every check on both nodes, through srun vs over SSH", "",
        md_table(["doctor", "wall s, median (min–max)", "× SSH (medians)", "× SSH (paired)",
                  "difference s", ""],
                 _rows(checks, "doctor --launcher ssh", ())), "",
        f"Exit statuses: {json.dumps(res['check_codes'])}. `--launcher ssh` gets "
        "`-H <the allocated nodes> --ssh-config <the bed's>`; both check the same nodes, the "
        "script and `--iface`.", "",
    ])


def outside(args: argparse.Namespace) -> str:
    from helpers.slurm_bed import start_slurm_cluster

    with bed_of(2) as bed, baseline_tree(args.baseline) as base:
        t0 = time.monotonic()
        cluster = start_slurm_cluster(bed)  # type: ignore[arg-type]
        log(f"Slurm cluster up in {time.monotonic() - t0:.1f} s")
        out = Path(tempfile.mkdtemp(prefix="dtlaunch-bench-slurm-", dir="/var/tmp")) / "r.json"
        try:
            argv = ["salloc", "--nodes=2", "--job-name=dtl-bench", PYTHON, __file__, "--inside",
                    "--reps", str(args.reps), "--subnet", bed.subnet,  # type: ignore[attr-defined]
                    "--ssh-config", str(bed.ssh_config), "--json", str(out)]  # type: ignore[attr-defined]
            if base:
                argv += ["--base", base, "--rev", args.baseline]
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            proc = cluster.run(*argv, env=env, timeout=args.timeout)
            sys.stderr.write(proc.stderr[-6000:])
            if proc.returncode != 0:
                raise SystemExit(f"salloc exited {proc.returncode}")
            res = json.loads(out.read_text())
        finally:
            cluster.stop()
            shutil.rmtree(out.parent, ignore_errors=True)
    command = command_line("slurm_launch.py", None)
    (ROOT / "bench" / "results" / "slurm_launch.json").write_text(
        public(json.dumps(res, indent=1)) + "\n")
    return write_result("slurm_launch.md", report(res, command))


def main() -> None:
    parser = bench_parser(__doc__, reps=7, baseline="also run dtlaunch as of git REV")
    parser.add_argument("--timeout", type=float, default=3000)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--subnet", help=argparse.SUPPRESS)
    parser.add_argument("--ssh-config", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    parser.add_argument("--base", help=argparse.SUPPRESS)
    parser.add_argument("--rev", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        Path(args.json).write_text(json.dumps(inside(args)))
    else:
        outside(args)


if __name__ == "__main__":
    main()
