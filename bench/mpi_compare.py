"""Per MPI (Open MPI 4, Open MPI 5, MPICH): launch ratio to that MPI's own hand-written command,
and the PTB small model's per-core scaling efficiency.

1. Launch: the tiny Horovod job (init + one allreduce) on 2 test-bed hosts, from inside h1's
   namespace, started by the hand-written `mpirun` (Open MPI) or `mpiexec` (MPICH) line and by
   `dtlaunch run` (with its pre-flight, warm cache; and `--no-check`), alternating.
2. Scaling: words/s of 2 ranks x 1 thread / (2 x words/s of 1 rank x 1 thread), all through
   `dtlaunch run -np N` on this machine, alternating, two ways. Goal ≥ 0.90.
   - per-rank batch fixed (20 streams per rank; 2 ranks train a global batch of 40): how
     Horovod's paper measures scaling. Each rank does exactly the work of the single rank, so
     the efficiency is what the allreduce, the launch and sharing the machine cost.
   - global batch fixed (20 streams; 2 ranks take 10 each: the updates of the 1-rank run).
     Each rank also pays the per-step costs that do not shrink with the batch (the optimizer
     step over all 4.7 M parameters, gradient clipping, the weight gradients' reads), so this
     figure is below the other even with free communication.

Each MPI runs with its own bin directory first on PATH and its own Python (torch and Horovod
built against it): the system's for Open MPI 4, the venvs of scripts/setup_mpis.sh for the others.

    python bench/mpi_compare.py [--reps 5] [--ptb-reps 5] [--max-steps 120] [--part launch|ptb|all]
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import (
    PYTHON,
    RESULTS,
    ROOT,
    TINY_JOB,
    VENVS,
    Sample,
    Series,
    bed_of,
    bench_parser,
    command_line,
    figure,
    fmt_s,
    loadavg,
    log,
    md_table,
    measured,
    mpi_venv,
    pyplot,
    ratio,
    sandwiched_ratios,
    ssh_wrapper,
    steady_rate,
    timed,
    warm_run,
    write_result,
)

MODULE = "dtlaunch.examples.ptb_lm"
GOAL_EFF = 0.90
DATA = Path(os.environ.get("DTLAUNCH_PTB_DATA", ROOT.parent / "shared" / "data" / "ptb"))
MPIS = ("openmpi4", "openmpi5", "mpich", "intelmpi")
HYDRA_MPIS = ("mpich", "intelmpi")
RAW = RESULTS / "raw"


def installed(mpis: tuple[str, ...], out: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, str]]]:
    """(name, python, environment) of each MPI of `mpis` whose venv is there; each missing one
    is recorded in `out` as not measured."""
    for name in mpis:
        setup = mpi_venv(name)
        if setup is None:
            out[name] = {"missing": f"no venv at {VENVS / name}"}
        else:
            yield name, *setup


def version(name: str, env: dict[str, str]) -> str:
    launcher = "mpiexec" if name in HYDRA_MPIS else "mpirun"
    out = timed([launcher, "--version"], env=env, check=False)
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    if name == "intelmpi":
        found = [ln for ln in lines if "Version" in ln and "Intel" in ln]
        return found[0] if found else "Intel MPI ?"
    if name == "mpich":
        found = [ln for ln in lines if ln.startswith("Version:")]
        return "MPICH " + found[0].split(":", 1)[1].strip() if found else "MPICH ?"
    return lines[0] if lines else "?"


def hand_argv(name: str, python: str, cfg: str, ssh_dir: Path) -> list[str]:
    """What a user would type for that MPI: the flags dtlaunch generates, minus its extras (its
    ssh agent, output tagging, environment allow-list); plain ssh with the bed's config."""
    if name == "intelmpi":  # its Hydra takes the ranks per host from -ppn, not -hosts h:N
        return ["mpiexec", "-n", "2", "-hosts", "h1,h2", "-ppn", "1", "-launcher", "ssh",
                "-launcher-exec", str(ssh_dir / "ssh"), "-iface", "eth0",
                "-genv", "FI_TCP_IFACE", "eth0",
                "-genvlist", "PATH,PYTHONPATH,OMP_NUM_THREADS", python, TINY_JOB]
    if name == "mpich":
        return ["mpiexec", "-n", "2", "-hosts", "h1:1,h2:1", "-launcher", "ssh",
                "-launcher-exec", str(ssh_dir / "ssh"), "-iface", "eth0",
                "-genvlist", "PATH,PYTHONPATH,OMP_NUM_THREADS", python, TINY_JOB]
    shm = "sm" if name == "openmpi5" else "vader"
    return ["mpirun", "--allow-run-as-root", "-np", "2", "-H", "h1:1,h2:1", "--bind-to", "none",
            "--map-by", "slot", "--mca", "pml", "ob1", "--mca", "btl", f"self,{shm},tcp",
            "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
            "--mca", "plm_rsh_args", f"-F {cfg}", "-x", "PATH", "-x", "PYTHONPATH",
            "-x", "OMP_NUM_THREADS", python, TINY_JOB]


def launch(reps: int, mpis: tuple[str, ...] = MPIS) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with bed_of(2) as bed, ssh_wrapper(bed.ssh_config) as wrap:  # type: ignore[attr-defined]
        cfg = str(bed.ssh_config)  # type: ignore[attr-defined]
        for name, python, env in installed(mpis, out):
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
                sample, missed = warm_run(lambda: inside([*dt, TINY_JOB], e), e["XDG_CACHE_HOME"])
                misses[0] += missed
                return sample

            hand_name = "mpiexec (by hand)" if name in HYDRA_MPIS else "mpirun (by hand)"
            tools = {
                hand_name: lambda hand=hand, env=env: inside(hand, env),
                "dtlaunch run (warm pre-flight)": warm,
                "dtlaunch run --no-check": lambda dt=dt, env=env: inside([*dt, "--no-check", TINY_JOB], env),
            }
            res = measured(tools, reps, f"launch {name}")
            out[name] = {"version": version(name, env), "load": res["load"],
                         "hand": hand_name, "hand_argv": hand, "warm_misses": misses[0],
                         "series": {k: s.times for k, s in res["series"].items()}}
    return out


BATCH = 20  # the small configuration's batch
# run name -> (ranks, global batch)
PTB_RUNS = {"1": (1, BATCH), "2": (2, BATCH), "2w": (2, 2 * BATCH)}
LOG_INTERVAL = 20  # steps per measured interval; the first is warm-up


# One rank per core: the 1-rank run's Horovod thread would otherwise run on the second core, so
# "1 rank x 1 thread" would use 2 cores and the 2-rank run would be compared with more than one
# core's work. Intel MPI pins each rank to a core by default; the others are told.
BIND = {"openmpi4": ["--binding-args", "-bind-to core"],
        "openmpi5": ["--binding-args", "-bind-to core"],
        "mpich": ["--binding-args", "-bind-to core"], "intelmpi": []}


def ptb_run(python: str, env: dict[str, str], np: int, steps: int, data: Path,
            batch: int = BATCH, binding: list[str] | None = None) -> float:
    """Steady words/s of one run: the first LOG_INTERVAL steps (allocation, Horovod's first
    negotiation of every tensor) are left out, as a long training run amortises them."""
    with tempfile.TemporaryDirectory(prefix="dtlaunch-bench-ptb-") as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        argv = [python, "-m", "dtlaunch", "run", "-np", str(np), *(binding or []),
                "-x", "OMP_NUM_THREADS=1",
                "-m", MODULE, "--threads", "1", "--max-steps", str(steps), "--no-eval",
                "--batch-size", str(batch), "--log-interval", str(LOG_INTERVAL),
                "--data-path", str(data), "--metrics", str(metrics)]
        timed(argv, env=env, timeout=1200)
        records = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln.strip()]
    rates = [float(r["words_per_sec"]) for r in records if r.get("event") == "progress"]
    if len(rates) < 2:
        raise SystemExit(f"PTB run of {steps} steps gave {len(rates)} interval(s) of "
                         f"{LOG_INTERVAL} steps; give --max-steps ≥ {2 * LOG_INTERVAL}")
    return steady_rate(rates)


def ptb(reps: int, steps: int, data: Path, mpis: tuple[str, ...] = MPIS,
        bind: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not (data / "ptb.train.txt").is_file():
        return {name: {"missing": f"no PTB data in {data}"} for name in mpis}
    for name, python, env in installed(mpis, out):
        before = loadavg()
        runs: dict[str, list[float]] = {k: [] for k in PTB_RUNS}
        sequence: list[tuple[str, float]] = []  # in time order, for the sandwiched ratios
        for rep in range(reps):
            order = list(PTB_RUNS) if rep % 2 == 0 else list(reversed(PTB_RUNS))
            for key in order:
                np, batch = PTB_RUNS[key]
                runs[key].append(ptb_run(python, env, np, steps, data, batch,
                                         BIND[name] if bind else None))
                sequence.append((key, runs[key][-1]))
            log(f"  ptb {name} rep {rep + 1}/{reps}: 1 rank {runs['1'][-1]:,.0f} w/s, "
                f"2 ranks {runs['2'][-1]:,.0f} w/s, 2 ranks x batch 20 {runs['2w'][-1]:,.0f} w/s")
        out[name] = {"load": f"{before} → {loadavg()}", "runs": runs, "steps": steps,
                     "sequence": sequence, "bound": bind}
    return out


def plain_argv(argv: list[str]) -> list[str]:
    """The hand-written line with this machine's paths replaced by what they are."""
    out = []
    for arg in argv:
        if arg == TINY_JOB or arg.endswith("/bench/scripts/tiny_job.py"):  # any checkout's
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
    effs: dict[str, tuple[float, float | None]] = {}  # MPI -> (per-rank batch, global batch)
    if ptb_res:
        steps = next((r["steps"] for r in ptb_res.values() if "steps" in r), "?")
        measured = [r for r in ptb_res.values() if "runs" in r]
        if all(r.get("bound") for r in measured):
            binding = ("each rank bound to a core (Intel MPI's default pinning, `-bind-to core` "
                       "for the others; unbound, the 1-rank run's Horovod thread takes the "
                       "second core, so its baseline is more than one core's work)")
        elif not any(r.get("bound") for r in measured):
            binding = ("ranks unbound (`--no-bind`; Intel MPI still pins them): the 1-rank "
                       "run's Horovod thread takes the second core")
        else:
            binding = "ranks bound for some MPIs and not for others (merged runs; see the raw results)"
        parts += ["### PTB small: per-core scaling efficiency", "",
                  f"`dtlaunch run -np N [--binding-args '-bind-to core'] -x OMP_NUM_THREADS=1 "
                  f"-m {MODULE} --threads 1 --max-steps {steps} --no-eval --batch-size B` on this "
                  f"machine, {binding}; the runs alternate, the "
                  "order reversed every repetition; words/s leave out each run's first "
                  f"{LOG_INTERVAL} steps (warm-up). Efficiency = words/s(2 ranks × 1 thread) ÷ "
                  f"(2 × words/s(1 rank × 1 thread, B = {BATCH})), each 2-rank run against the "
                  "1-rank runs just before and after it (this machine's speed drifts by ±10 % "
                  "from minute to minute); median (min–max) of those ratios; goal ≥ "
                  f"{GOAL_EFF:.2f}. "
                  f"**Per-rank batch fixed** (B = {2 * BATCH} for 2 ranks: {BATCH} streams each, "
                  "as Horovod's paper measures): each rank does the single rank's work, so the "
                  "figure is what the allreduce, the launch and sharing the machine cost. "
                  f"**Global batch fixed** (B = {BATCH}: 10 streams each, the 1-rank run's "
                  "updates): each rank also pays the per-step costs that do not halve with its "
                  "batch (the optimizer step and clipping over all 4.7 M parameters, the weight "
                  "gradients), so it is lower even with free communication.", ""]
        rows = []
        for name, res in ptb_res.items():
            if "missing" in res:
                rows.append([name, "–", "–", "–", "–", "–", f"not measured: {res['missing']}", "–"])
                continue
            eff = efficiencies(res)
            weak, strong = eff.get("2w"), eff["2"]
            main = weak if weak is not None else strong
            effs[name] = (main[0], strong[0] if weak is not None else None)
            words = {k: f"{statistics.median(v):,.0f}" if v else "–" for k, v in res["runs"].items()}
            rows.append([name, words["1"], words.get("2w", "–"), shown(weak), words["2"],
                         shown(strong), "met" if main[0] >= GOAL_EFF else "MISSED", res["load"]])
        parts += [md_table(["MPI", "words/s 1 rank", "words/s 2 ranks, per-rank batch fixed",
                            "efficiency", "words/s 2 ranks, global batch fixed", "efficiency",
                            f"goal ≥ {GOAL_EFF:.2f} (per-rank batch)", "load average"], rows), "",
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
                         f"{effs[name][0]:.2f}" if name in effs else "–",
                         f"{effs[name][1]:.2f}" if name in effs and effs[name][1] else "–"])
        parts += ["### Summary", "", md_table(
            ["MPI", "version", "dtlaunch (warm pre-flight) × by hand",
             "dtlaunch --no-check × by hand", "PTB scaling efficiency (per-rank batch fixed)",
             "(global batch fixed)"], rows), ""]
    return "\n".join(parts)


def efficiencies(res: dict[str, Any]) -> dict[str, tuple[float, float, float]]:
    """Per 2-rank run kind: (median, min, max) of its sandwiched efficiencies; results written
    before the time order was kept fall back to the ratio of medians."""
    out: dict[str, tuple[float, float, float]] = {}
    sequence = [tuple(x) for x in res.get("sequence", [])]
    for key in ("2", "2w"):
        if not res["runs"].get(key):
            continue
        effs = sandwiched_ratios(sequence, key, "1", scale=2.0) if sequence else []
        if not effs:
            effs = [statistics.median(res["runs"][key]) / (2 * statistics.median(res["runs"]["1"]))]
        out[key] = (statistics.median(effs), min(effs), max(effs))
    return out


def shown(eff: tuple[float, float, float] | None) -> str:
    if eff is None:
        return "–"
    return f"{eff[0]:.2f}" if eff[1] == eff[2] else f"{eff[0]:.2f} ({eff[1]:.2f}–{eff[2]:.2f})"


def plot(launch_res: dict[str, Any] | None, ptb_res: dict[str, Any] | None) -> str:
    if pyplot() is None:
        return "no plot"
    with figure(RESULTS / "mpi_compare.png", dpi=110, ncols=2, figsize=(10, 4)) as (_, (a, b)):
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
        effs = [efficiencies(ptb_res[n]) for n in pn]  # type: ignore[index]
        strong = [e["2"][0] for e in effs]
        weak = [e["2w"][0] if "2w" in e else 0.0 for e in effs]
        xs = range(len(pn))
        b.bar([x - 0.2 for x in xs], weak, 0.4, color="C2", label="per-rank batch fixed")
        b.bar([x + 0.2 for x in xs], strong, 0.4, color="C4", label="global batch fixed")
        b.set_xticks(list(xs), pn)
        b.axhline(GOAL_EFF, color="k", ls="--", lw=1, label=f"goal {GOAL_EFF:.2f}")
        b.set_ylim(0, 1.1)
        b.set_ylabel("scaling efficiency")
        b.set_title("PTB small, 2 ranks × 1 thread vs 1 × 1")
        b.legend(fontsize=7)
    return "plot: results/mpi_compare.png"


def _save(path: Path, res: dict[str, Any], merge: bool) -> None:
    """Write one part's raw results; with --only, over the last run's for the other MPIs (the
    commands of both are kept)."""
    if merge and path.exists():
        old = json.loads(path.read_text())
        command = " ; ".join(dict.fromkeys(filter(None, [old.pop("_command", ""),
                                                          res.pop("_command", "")])))
        res = {"_command": command, **{k: v for k, v in old.items() if k not in res}, **res}
        res = {"_command": res.pop("_command"), **{m: res[m] for m in MPIS if m in res}}
    path.write_text(json.dumps(res, indent=1))


def main(argv: list[str] | None = None) -> str:
    parser = bench_parser(__doc__, reps=5, reps_help="launch repetitions (after 1 warm-up)")
    parser.add_argument("--ptb-reps", type=int, default=5)
    parser.add_argument("--max-steps", type=int, default=120)
    parser.add_argument("--data-path", type=Path, default=DATA)
    parser.add_argument("--no-bind", action="store_true",
                        help="PTB: leave the ranks unbound (the 1-rank run then uses 2 cores)")
    parser.add_argument("--part", choices=("launch", "ptb", "all", "report"), default="all",
                        help="measure one part (the other's last raw results are reused)")
    parser.add_argument("--only", choices=MPIS, action="append",
                        help="measure only this MPI (repeatable); the others' last raw results "
                             "are kept")
    args = parser.parse_args(argv)
    mpis = tuple(args.only or MPIS)
    RAW.mkdir(parents=True, exist_ok=True)
    command = command_line("mpi_compare.py", argv)
    if args.part in ("launch", "all"):
        res = {"_command": command, **launch(args.reps, mpis)}
        _save(RAW / "mpi_compare_launch.json", res, bool(args.only))
    if args.part in ("ptb", "all"):
        res = {"_command": command,
               **ptb(args.ptb_reps, args.max_steps, args.data_path, mpis, not args.no_bind)}
        _save(RAW / "mpi_compare_ptb.json", res, bool(args.only))
    loaded = [json.loads(p.read_text()) if p.exists() else None
              for p in (RAW / "mpi_compare_launch.json", RAW / "mpi_compare_ptb.json")]
    commands = [r.pop("_command", "") for r in loaded if r]
    text = report(loaded[0], loaded[1], " ; ".join(dict.fromkeys(c for c in commands if c)))
    log(plot(loaded[0], loaded[1]))
    return write_result("mpi_compare.md", text)


if __name__ == "__main__":
    main()
