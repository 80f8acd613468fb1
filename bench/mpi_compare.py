"""Per MPI (Open MPI 4, Open MPI 5, MPICH): launch ratio to that MPI's own hand-written command,
and the PTB small model's per-core scaling efficiency.

1. Launch: the tiny Horovod job (init + one allreduce) on 2 test-bed hosts, from inside h1's
   namespace, started by the hand-written `mpirun` (Open MPI) or `mpiexec` (MPICH) line and by
   `dtlaunch run` (with its pre-flight, warm cache; and `--no-check`), alternating.
2. Scaling: words/s of 2 ranks x 1 thread / (2 x words/s of 1 rank x 1 thread), both through
   `dtlaunch run -np N` on this machine, alternating. Goal ≥ 0.90.

Each MPI runs with its own bin directory first on PATH and its own Python (torch and Horovod
built against it): the system's for Open MPI 4, the venvs of scripts/setup_mpis.sh for the others.

    python bench/mpi_compare.py [--reps 5] [--ptb-reps 2] [--max-steps 150] [--part launch|ptb|all]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    PYTHON,
    RESULTS,
    ROOT,
    SCRIPTS,
    Sample,
    Series,
    bed_of,
    fmt_s,
    loadavg,
    log,
    md_table,
    ratio,
    round_robin,
    ssh_wrapper,
    timed,
    worktree_env,
    write_result,
)

JOB = str(SCRIPTS / "tiny_job.py")
MODULE = "dtlaunch.examples.ptb_lm"
GOAL_EFF = 0.90
VENVS = Path(os.environ.get("DTLAUNCH_MPI_VENVS") or Path.home() / ".cache" / "dtlaunch" / "mpi-venvs")
DATA = Path(os.environ.get("DTLAUNCH_PTB_DATA", ROOT.parent / "shared" / "data" / "ptb"))
MPIS = ("openmpi4", "openmpi5", "mpich")
CACHE_REFRESH_S = 200.0  # the pre-flight cache lives 300 s
RAW = RESULTS / "raw"


def mpi_setup(name: str) -> tuple[str, dict[str, str]] | None:
    """(python, environment) for one MPI, or None when its venv is not there."""
    env = worktree_env()
    if name == "openmpi4":
        return PYTHON, env
    folder = VENVS / name / "bin"
    if not (folder / "python").exists():
        return None
    env["PATH"] = f"{folder}{os.pathsep}{env['PATH']}"
    return str(folder / "python"), env


def version(name: str, env: dict[str, str]) -> str:
    launcher = "mpiexec" if name == "mpich" else "mpirun"
    out = timed([launcher, "--version"], env=env, check=False)
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    if name == "mpich":
        found = [ln for ln in lines if ln.startswith("Version:")]
        return "MPICH " + found[0].split(":", 1)[1].strip() if found else "MPICH ?"
    return lines[0] if lines else "?"


def hand_argv(name: str, python: str, cfg: str, ssh_dir: Path) -> list[str]:
    """What a user would type for that MPI: the flags dtlaunch generates, minus its extras (its
    ssh agent, output tagging, environment allow-list); plain ssh with the bed's config."""
    if name == "mpich":
        return ["mpiexec", "-n", "2", "-hosts", "h1:1,h2:1", "-launcher", "ssh",
                "-launcher-exec", str(ssh_dir / "ssh"), "-iface", "eth0",
                "-genvlist", "PATH,PYTHONPATH,OMP_NUM_THREADS", python, JOB]
    shm = "sm" if name == "openmpi5" else "vader"
    return ["mpirun", "--allow-run-as-root", "-np", "2", "-H", "h1:1,h2:1", "--bind-to", "none",
            "--map-by", "slot", "--mca", "pml", "ob1", "--mca", "btl", f"self,{shm},tcp",
            "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
            "--mca", "plm_rsh_args", f"-F {cfg}", "-x", "PATH", "-x", "PYTHONPATH",
            "-x", "OMP_NUM_THREADS", python, JOB]


def launch(reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with bed_of(2) as bed, ssh_wrapper(bed.ssh_config) as wrap:  # type: ignore[attr-defined]
        cfg = str(bed.ssh_config)  # type: ignore[attr-defined]
        for name in MPIS:
            setup = mpi_setup(name)
            if setup is None:
                out[name] = {"missing": f"no venv at {VENVS / name}"}
                continue
            python, env = setup
            cache = Path(tempfile.mkdtemp(prefix="dtlaunch-bench-cache-"))
            warm_env = dict(env, XDG_CACHE_HOME=str(cache))
            dt = [python, "-m", "dtlaunch", "run", "-v", "-H", "h1:1,h2:1", "--iface", "eth0",
                  "--ssh-config", cfg]
            hand = hand_argv(name, python, cfg, wrap)
            misses = [0]

            def inside(argv: list[str], e: dict[str, str]) -> Sample:
                return timed(bed.nsenter_argv("h1", argv), env=e)  # type: ignore[attr-defined]

            def warm(e: dict[str, str] = warm_env, dt: list[str] = dt,
                     misses: list[int] = misses) -> Sample:
                caches = list(Path(e["XDG_CACHE_HOME"]).glob("dtlaunch/preflight-*.json"))
                if caches and time.time() - max(f.stat().st_mtime for f in caches) > CACHE_REFRESH_S:
                    for f in caches:
                        f.unlink()
                    inside([*dt, JOB], e)  # refill, untimed
                sample = inside([*dt, JOB], e)
                if "(cached)" not in sample.stderr:
                    misses[0] += 1
                return sample

            hand_name = "mpiexec (by hand)" if name == "mpich" else "mpirun (by hand)"
            tools = {
                hand_name: lambda hand=hand, env=env: inside(hand, env),
                "dtlaunch run (warm pre-flight)": warm,
                "dtlaunch run --no-check": lambda dt=dt, env=env: inside([*dt, "--no-check", JOB], env),
            }
            before = loadavg()
            series = round_robin(tools, reps, warmup=1, label=f"launch {name}")
            out[name] = {"version": version(name, env), "load": f"{before} → {loadavg()}",
                         "hand": hand_name, "hand_argv": hand, "warm_misses": max(0, misses[0] - 1),
                         "series": {k: s.times for k, s in series.items()}}
    return out


def ptb_run(python: str, env: dict[str, str], np: int, steps: int, data: Path) -> float:
    with tempfile.TemporaryDirectory(prefix="dtlaunch-bench-ptb-") as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        argv = [python, "-m", "dtlaunch", "run", "-np", str(np), "-x", "OMP_NUM_THREADS=1",
                "-m", MODULE, "--threads", "1", "--max-steps", str(steps), "--no-eval",
                "--data-path", str(data), "--metrics", str(metrics)]
        timed(argv, env=env, timeout=1200)
        records = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln.strip()]
    return float(next(r for r in reversed(records) if r.get("event") == "final")["words_per_sec"])


def ptb(reps: int, steps: int, data: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not (data / "ptb.train.txt").is_file():
        return {name: {"missing": f"no PTB data in {data}"} for name in MPIS}
    for name in MPIS:
        setup = mpi_setup(name)
        if setup is None:
            out[name] = {"missing": f"no venv at {VENVS / name}"}
            continue
        python, env = setup
        before = loadavg()
        runs: dict[str, list[float]] = {"1": [], "2": []}
        for rep in range(reps):
            order = ("1", "2") if rep % 2 == 0 else ("2", "1")
            for np in order:
                runs[np].append(ptb_run(python, env, int(np), steps, data))
            log(f"  ptb {name} rep {rep + 1}/{reps}: 1 rank {runs['1'][-1]:,.0f} w/s, "
                f"2 ranks {runs['2'][-1]:,.0f} w/s")
        out[name] = {"load": f"{before} → {loadavg()}", "runs": runs, "steps": steps}
    return out


def plain_argv(argv: list[str]) -> list[str]:
    """The hand-written line with this machine's paths replaced by what they are."""
    out = []
    for arg in argv:
        if arg == JOB:
            arg = "bench/scripts/tiny_job.py"
        elif arg.endswith("/python") or arg == PYTHON:
            arg = "<that MPI's python>"
        elif arg.startswith("-F "):
            arg = "-F <bed ssh_config>"
        elif arg.endswith("/ssh"):
            arg = "<ssh that adds -F bed ssh_config>"
        out.append(arg)
    return out


def report(launch_res: dict[str, Any] | None, ptb_res: dict[str, Any] | None, command: str) -> str:
    parts = ["## Per MPI: launch ratio and PTB scaling efficiency", "",
             f"Command (as root, from the repository root): `{command}`", ""]
    summary = []
    if launch_res:
        parts += ["### Launch: tiny Horovod job (init + one allreduce), 2 test-bed hosts", "",
                  "From inside host h1's namespace, `eth0`; medians (min–max) of the repetitions; "
                  "ratios to that MPI's own hand-written command.", ""]
        for name, res in launch_res.items():
            if "missing" in res:
                parts += [f"**{name}**: not measured ({res['missing']}).", ""]
                continue
            series = {k: Series(k, [Sample(t, 0) for t in v]) for k, v in res["series"].items()}
            base = series[res["hand"]]
            rows = []
            for k, s in series.items():
                paired = statistics.median(ratio(a, b) for a, b in zip(s.times, base.times))
                rows.append([k, fmt_s(s), f"{ratio(s.median, base.median):.2f}", f"{paired:.2f}",
                             f"{s.median - base.median:+.2f}"])
            parts += [f"**{name}** ({res['version']}; {len(base.times)} repetitions; load "
                      f"average {res['load']})", "",
                      md_table(["launcher", "wall s, median (min–max)", "× by hand (medians)",
                                "× by hand (paired)", "overhead s"], rows), "",
                      f"By hand: `{shlex.join(plain_argv(res['hand_argv']))}`", ""]
            if res["warm_misses"]:
                parts += [f"({res['warm_misses']} warm sample(s) missed the cache)", ""]
            summary.append((name, res["version"],
                            ratio(series["dtlaunch run (warm pre-flight)"].median, base.median),
                            ratio(series["dtlaunch run --no-check"].median, base.median)))
    effs: dict[str, float] = {}
    if ptb_res:
        steps = next((r["steps"] for r in ptb_res.values() if "steps" in r), "?")
        parts += ["### PTB small: per-core scaling efficiency", "",
                  f"`dtlaunch run -np N -x OMP_NUM_THREADS=1 -m {MODULE} --threads 1 --max-steps "
                  f"{steps} --no-eval` on this machine (global batch fixed, so 2 ranks each take "
                  "half); 1 and 2 ranks alternating, the order swapped every repetition. "
                  f"Efficiency = words/s(2 ranks × 1 thread) ÷ (2 × words/s(1 rank × 1 thread)); "
                  f"goal ≥ {GOAL_EFF:.2f}.", ""]
        rows = []
        for name, res in ptb_res.items():
            if "missing" in res:
                rows.append([name, "–", "–", "–", f"not measured: {res['missing']}", "–"])
                continue
            one = statistics.median(res["runs"]["1"])
            two = statistics.median(res["runs"]["2"])
            paired = statistics.median(b / (2 * a) for a, b in zip(res["runs"]["1"], res["runs"]["2"]))
            effs[name] = two / (2 * one)
            rows.append([name, f"{one:,.0f}", f"{two:,.0f}", f"{effs[name]:.2f} (paired {paired:.2f})",
                         "met" if effs[name] >= GOAL_EFF else "MISSED", res["load"]])
        parts += [md_table(["MPI", "words/s 1 rank × 1 thread", "words/s 2 ranks × 1 thread",
                            "efficiency", f"goal ≥ {GOAL_EFF:.2f}", "load average"], rows), "",
                  "Per-core efficiency says what the launch and allreduce path cost only when "
                  "the machine has 2 idle cores: with a load average above the core count, each "
                  "1-thread rank gets a share of a core, not a core, and 2 ranks wait on each "
                  "other's allreduce at the pace of the slower share; read the load column first.",
                  ""]
    if summary or effs:
        rows = []
        for name in MPIS:
            hit = next((x for x in summary if x[0] == name), None)
            rows.append([name, hit[1] if hit else "–", f"{hit[2]:.2f}" if hit else "–",
                         f"{hit[3]:.2f}" if hit else "–",
                         f"{effs[name]:.2f}" if name in effs else "–"])
        parts += ["### Summary", "", md_table(
            ["MPI", "version", "dtlaunch (warm pre-flight) × by hand",
             "dtlaunch --no-check × by hand", "PTB scaling efficiency"], rows), ""]
    return "\n".join(parts)


def plot(launch_res: dict[str, Any] | None, ptb_res: dict[str, Any] | None) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no plot"
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    names = [n for n in MPIS if launch_res and "series" in launch_res.get(n, {})]
    width = 0.27
    for i, name in enumerate(names):
        res = launch_res[name]  # type: ignore[index]
        for j, (k, v) in enumerate(res["series"].items()):
            a.bar(i + (j - 1) * width, statistics.median(v), width,
                  color=f"C{j}", label=k.replace(" (by hand)", "").replace("mpiexec", "by hand")
                  .replace("mpirun", "by hand") + (" (mpirun / mpiexec)" if j == 0 else "")
                  if i == 0 else None)
    a.set_xticks(range(len(names)), names)
    a.set_ylabel("launch wall s (median)")
    a.set_title("tiny Horovod job, 2 hosts")
    a.legend(fontsize=7)
    pn = [n for n in MPIS if ptb_res and "runs" in ptb_res.get(n, {})]
    effs = [statistics.median(ptb_res[n]["runs"]["2"]) / (2 * statistics.median(ptb_res[n]["runs"]["1"]))  # type: ignore[index]
            for n in pn]
    b.bar(pn, effs, color="C2")
    b.axhline(GOAL_EFF, color="k", ls="--", lw=1, label=f"goal {GOAL_EFF:.2f}")
    b.set_ylim(0, 1.1)
    b.set_ylabel("scaling efficiency")
    b.set_title("PTB small, 2 ranks × 1 thread vs 1 × 1")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / "mpi_compare.png", dpi=110)
    return "plot: results/mpi_compare.png"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5, help="launch repetitions (after 1 warm-up)")
    parser.add_argument("--ptb-reps", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=150)
    parser.add_argument("--data-path", type=Path, default=DATA)
    parser.add_argument("--part", choices=("launch", "ptb", "all", "report"), default="all",
                        help="measure one part (the other's last raw results are reused)")
    args = parser.parse_args(argv)
    RAW.mkdir(parents=True, exist_ok=True)
    command = "python bench/mpi_compare.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.part in ("launch", "all"):
        res = {"_command": command.strip(), **launch(args.reps)}
        (RAW / "mpi_compare_launch.json").write_text(json.dumps(res, indent=1))
    if args.part in ("ptb", "all"):
        res = {"_command": command.strip(), **ptb(args.ptb_reps, args.max_steps, args.data_path)}
        (RAW / "mpi_compare_ptb.json").write_text(json.dumps(res, indent=1))
    loaded = [json.loads(p.read_text()) if p.exists() else None
              for p in (RAW / "mpi_compare_launch.json", RAW / "mpi_compare_ptb.json")]
    commands = [r.pop("_command", "") for r in loaded if r]
    text = report(loaded[0], loaded[1], " ; ".join(dict.fromkeys(c for c in commands if c)))
    log(plot(loaded[0], loaded[1]))
    return write_result("mpi_compare.md", text)


if __name__ == "__main__":
    main()
