"""torch.distributed launch: a tiny all_reduce job (Gloo on CPU, one worker per host,
scripts/torch_allreduce.py) on N test-bed hosts, started from outside the hosts (a login
machine that ssh reaches every host from) by `dtlaunch run --torch` with its pre-flight on
(cache off: every run checks every host) against what users do today: torchrun started by hand
on every host over ssh, all at once, with a static rendezvous (`torchrun --nnodes N --node-rank
i --nproc-per-node 1 --master-addr <h1's address> --master-port P`), timed until every ssh has
ended. Paired: each repetition runs both, the first alternating.

Then a worker killed mid-job: the same job, every worker in a training-like loop (one
all_reduce every --step seconds); once every worker is up, the last host's worker gets SIGKILL,
and the clock runs until every process the job had on every host (workers, torchrun's agents
or dtlaunch's) has ended, and until the launcher (dtlaunch, or the last ssh) has exited; capped
at --cap seconds (then everything is killed and the figure is "> cap"). `--steps 0.1,300` also
times a job whose workers are in a long step with no collective (300 s between two
all_reduces), where no Gloo socket tells the survivors anything.

    sudo .venv/bin/python bench/torch_launch.py [--reps 5] [--hosts 2,16] [--kill-reps 3]
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shlex
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import (
    PYTHON,
    SCRIPTS,
    Sample,
    Series,
    bed_of,
    bench_parser,
    dtlaunch_argv,
    fmt_s,
    host_counts,
    loadavg,
    log,
    md_table,
    publish,
    ratio,
    round_robin,
    timed,
    worktree_env,
)

JOB = str(SCRIPTS / "torch_allreduce.py")
TORCHRUN = str(Path(PYTHON).parent / "torchrun")
GOAL = 1.0  # dtlaunch run --torch (pre-flight on) / torchrun by hand
DTLAUNCH, BY_HAND = "dtlaunch run --torch (pre-flight)", "torchrun by hand (ssh)"
PREFLIGHT = re.compile(r"pre-flight: \d+ host\(s\) ready \(([\d.]+) s\)")
PORTS = itertools.count(29500)  # a fresh master port for each hand-started job


def torchrun_commands(bed: Any, port: int, job: Sequence[str]) -> list[list[str]]:
    """One ssh per host, each starting torchrun as a careful user types it: the master as an
    address (the bed's names resolve nowhere but in its ssh config), Gloo's interface named,
    one OpenMP thread as dtlaunch's ranks get here."""
    n = len(bed.hosts)
    out = []
    for i, host in enumerate(bed.names):
        remote = ["env", "OMP_NUM_THREADS=1", "GLOO_SOCKET_IFNAME=eth0", TORCHRUN,
                  "--nnodes", str(n), "--node-rank", str(i), "--nproc-per-node", "1",
                  "--master-addr", bed.hosts[0].address, "--master-port", str(port), *job]
        out.append(["ssh", "-F", str(bed.ssh_config), host, "cd /tmp && " + shlex.join(remote)])
    return out


def start_all(commands: Sequence[Sequence[str]],
              env: dict[str, str] | None = None) -> list[subprocess.Popen[str]]:
    return [subprocess.Popen(list(c), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True,
                             env=env, cwd="/tmp")
            for c in commands]


def end_all(procs: Sequence[subprocess.Popen[str]]) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def by_hand(bed: Any, timeout: float = 600) -> Sample:
    """torchrun on every host at once over ssh; wall time until the last ssh has ended."""
    started = time.perf_counter()
    procs = start_all(torchrun_commands(bed, next(PORTS), [JOB]))
    try:
        outs = [p.communicate(timeout=max(1.0, timeout - (time.perf_counter() - started)))
                for p in procs]
    finally:
        end_all(procs)
    seconds = time.perf_counter() - started
    failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
    if failed:
        raise RuntimeError(f"torchrun by hand failed on host(s) {failed}:\n"
                           + "\n".join(o[1][-1500:] for o in outs))
    return Sample(seconds, 0, stdout=outs[0][0], stderr="\n".join(o[1] for o in outs))


def dtlaunch_job(bed: Any, *job: str) -> list[str]:
    hosts = ",".join(f"{h}:1" for h in bed.names)
    return dtlaunch_argv("run", "--torch", "-v", "-H", hosts, "--ssh-config",
                         str(bed.ssh_config), *job)


def dtlaunch_env() -> dict[str, str]:
    """This checkout's dtlaunch, its pre-flight cache off: every run checks every host."""
    return dict(worktree_env(), DTLAUNCH_PREFLIGHT_CACHE="0")


def launch_figure(bed: Any, reps: int, warmup: int) -> dict[str, Any]:
    env = dtlaunch_env()
    tools = {DTLAUNCH: lambda: timed(dtlaunch_job(bed, JOB), env=env, cwd="/tmp", timeout=600),
             BY_HAND: lambda: by_hand(bed)}
    before = loadavg()
    series = round_robin(tools, reps, warmup=warmup, label=f"torch launch {len(bed.hosts)} hosts")
    preflight = [float(m.group(1)) for s in series[DTLAUNCH].samples
                 for m in [PREFLIGHT.search(s.stderr)] if m]
    return {"hosts": len(bed.hosts), "series": series, "load": f"{before} → {loadavg()}",
            "preflight": preflight}


# --- a worker killed mid-job --------------------------------------------------------------------


def alive(pid: int) -> bool:
    """Whether pid runs (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_ready(folder: Path, n: int, procs: Sequence[subprocess.Popen[str]],
               timeout: float = 600) -> dict[int, int]:
    """rank -> pid once every worker has written its ready file."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {}
        for path in folder.glob("ready.*"):
            with contextlib.suppress(ValueError, OSError):
                found[int(path.name.split(".")[1])] = int(path.read_text())
        if len(found) == n:
            return found
        if any(p.poll() is not None for p in procs):
            outs = [p.communicate() for p in procs]
            raise RuntimeError("the job ended before every worker was up:\n"
                               + "\n".join(o[1][-1500:] for o in outs))
        time.sleep(0.1)
    raise RuntimeError(f"not every worker was up within {timeout:g} s")


def one_kill(bed: Any, tool: str, step: float, cap: float) -> dict[str, Any]:
    """Start the job, SIGKILL the last host's worker once all are up; seconds until every
    process the job had on the hosts has ended, and until the launcher has exited."""
    n = len(bed.hosts)
    with tempfile.TemporaryDirectory(prefix="dtlaunch-bench-kill-") as tmp:
        os.chmod(tmp, 0o755)
        job = [JOB, "--hold", tmp, "--step", str(step), "--hold-for", str(cap + 600)]
        if tool == DTLAUNCH:
            procs = start_all([dtlaunch_job(bed, *job)], dtlaunch_env())
        else:
            procs = start_all(torchrun_commands(bed, next(PORTS), job))
        on_hosts: set[int] = set()
        try:
            pids = wait_ready(Path(tmp), n, procs)
            time.sleep(1.0)  # a few steps of the loop
            on_hosts = {p for host in bed.names for p in bed.stray_pids(host)}
            killed_at = time.monotonic()
            os.kill(pids[n - 1], signal.SIGKILL)
            workers_end = hosts_end = launcher_end = None
            while time.monotonic() - killed_at < cap:
                now = time.monotonic() - killed_at
                if workers_end is None and not any(alive(p) for p in pids.values()):
                    workers_end = now
                if hosts_end is None and not any(alive(p) for p in on_hosts):
                    hosts_end = now
                if launcher_end is None and all(p.poll() is not None for p in procs):
                    launcher_end = now
                if None not in (workers_end, hosts_end, launcher_end):
                    break
                time.sleep(0.05)
            codes = [p.poll() for p in procs]
        finally:
            end_all(procs)
            for pid in on_hosts:  # what outlived the cap
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    result = {"workers": workers_end, "hosts": hosts_end, "launcher": launcher_end,
              "codes": codes}
    log(f"  kill {n} hosts step {step:g} s, {tool}: {result}")
    return result


def kill_figure(bed: Any, reps: int, steps: Sequence[float], cap: float) -> list[dict[str, Any]]:
    out = []
    for step in steps:
        before = loadavg()
        runs: dict[str, list[dict[str, Any]]] = {DTLAUNCH: [], BY_HAND: []}
        for rep in range(reps):
            order = [DTLAUNCH, BY_HAND] if rep % 2 == 0 else [BY_HAND, DTLAUNCH]
            for tool in order:
                runs[tool].append(one_kill(bed, tool, step, cap))
        out.append({"hosts": len(bed.hosts), "step": step, "cap": cap, "runs": runs,
                    "load": f"{before} → {loadavg()}"})
    return out


# --- the report ---------------------------------------------------------------------------------


def capped(values: Sequence[float | None], cap: float) -> str:
    """Median (min-max) of seconds where None is a run that reached the cap."""
    if not values:
        return "–"
    keyed = sorted(values, key=lambda v: float("inf") if v is None else v)

    def show(v: float | None) -> str:
        return f"> {cap:g}" if v is None else f"{v:.2f}"

    med = keyed[(len(keyed) - 1) // 2] if len(keyed) % 2 else None
    if len(keyed) % 2 == 0:
        a, b = keyed[len(keyed) // 2 - 1], keyed[len(keyed) // 2]
        med = None if a is None or b is None else (a + b) / 2
    return f"{show(med)} ({show(keyed[0])}–{show(keyed[-1])})"


def report(launches: list[dict[str, Any]], kills: list[dict[str, Any]], command: str) -> str:
    from common import run_header

    parts = ["## torch.distributed: `dtlaunch run --torch` against torchrun started by hand", "",
             *run_header(command, ""), ""]
    if launches:
        parts += ["### Launch of a tiny all_reduce job (Gloo, CPU, one worker per host)", ""]
        rows = []
        for res in launches:
            series: dict[str, Series] = res["series"]
            dt, hand = series[DTLAUNCH], series[BY_HAND]
            paired = [a.seconds / b.seconds for a, b in zip(dt.samples, hand.samples)]
            pre = res["preflight"]
            rows.append([res["hosts"], fmt_s(dt), fmt_s(hand),
                         f"**{ratio(dt.median, hand.median):.2f}**",
                         f"{statistics.median(paired):.2f}" if paired else "–",
                         f"{statistics.median(pre):.2f}" if pre else "–", len(dt.samples),
                         res["load"]])
        parts += [md_table(["hosts", f"{DTLAUNCH} s", f"{BY_HAND} s",
                            "× torchrun (medians)", "median of paired ×",
                            "of which pre-flight s", "pairs", "load average"], rows), "",
                  f"Goal: ≤ {GOAL:.1f} × torchrun by hand at every size. Seconds: median "
                  "(min–max) of the pairs; each pair runs both, the first alternating. dtlaunch "
                  "runs with DTLAUNCH_PREFLIGHT_CACHE=0 (every run checks every host over ssh) "
                  "and `-v` (its pre-flight line gives the pre-flight's share).", ""]
    if kills:
        parts += ["### A worker killed mid-job (SIGKILL of the last host's worker)", ""]
        rows = []
        for res in kills:
            for tool, runs in res["runs"].items():
                rows.append([res["hosts"], f"{res['step']:g}", tool,
                             capped([r["workers"] for r in runs], res["cap"]),
                             capped([r["hosts"] for r in runs], res["cap"]),
                             capped([r["launcher"] for r in runs], res["cap"]), len(runs),
                             res["load"]])
        parts += [md_table(["hosts", "s between all_reduces", "launcher",
                            "every worker ended, s", "every process of the job on the hosts "
                            "ended, s", "launcher exited, s", "runs", "load average"], rows), "",
                  "Seconds from the SIGKILL, median (min–max); \"> cap\": still running at the "
                  "cap, then killed by the benchmark. The processes of the job on the hosts are "
                  "those every host's namespace held just before the kill (workers, torchrun's "
                  "agents or dtlaunch's, their ssh sessions).", ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> str:
    from common import command_line

    parser = bench_parser(__doc__, reps=5, hosts="2,16", out="torch_launch.md")
    parser.add_argument("--warmup", type=int, default=1, help="dropped rounds per size")
    parser.add_argument("--kill-reps", type=int, default=3)
    parser.add_argument("--kill-hosts", help="sizes for the kill figure (default: --hosts)")
    parser.add_argument("--steps", default="0.1", help="seconds between two all_reduces")
    parser.add_argument("--cap", type=float, default=120.0)
    args = parser.parse_args(argv)
    sizes = host_counts(args.hosts)
    kill_sizes = sizes if args.kill_hosts is None else host_counts(args.kill_hosts)
    steps = [float(s) for s in args.steps.split(",") if s]
    launches: list[dict[str, Any]] = []
    kills: list[dict[str, Any]] = []
    for n in sorted(set(sizes) | set(kill_sizes)):
        with bed_of(n) as bed:
            if n in sizes and args.reps > 0:
                launches.append(launch_figure(bed, args.reps, args.warmup))
            if n in kill_sizes and args.kill_reps > 0:
                kills += kill_figure(bed, args.kill_reps, steps, args.cap)
    command = command_line("torch_launch.py", argv)
    return publish(args.out, {"launch": launches, "kill": kills},
                   lambda png: report(launches, kills, command))


if __name__ == "__main__":
    main()
