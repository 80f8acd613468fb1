"""Launch at scale: a tiny MPI job (C: MPI_Init + one allreduce, `scripts/tiny_mpi.c`) on 8, 32
and 64 test-bed hosts x 2 slots, started from a separate login host (h1, not in the job) by a
hand-written `mpirun`/`mpiexec` line, `dtlaunch run` (warm and cold pre-flight, `--tree-spawn`)
and `horovodrun`, for Open MPI (the system's) and MPICH (its venv), side by side in one run.

The job is not Python: 128 ranks importing torch on 2 cores would time the imports, not the
launcher. The login host runs no rank, so the launcher's CPU (a cgroup holding the launcher and
everything it starts there: ssh clients, dtlaunch's ssh agents) is the launcher's alone.

    python bench/scale_launch.py [--reps 3] [--hosts 8,32,64] [--mpis openmpi4,mpich] [--baseline REV]
                                 [--prebuilt DIR] [--only 'warm,tree']

--prebuilt DIR takes the job as DIR/tiny_openmpi4 and DIR/tiny_mpich, built elsewhere against
the same MPI, for a machine with the MPIs' run-time files but no compiler wrappers.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    SCRIPTS,
    VENVS,
    Sample,
    Series,
    baseline_tree,
    bed_of,
    bench_parser,
    command_line,
    cpu_group,
    figure,
    fmt_s,
    horovodrun_env,
    horovodrun_path,
    host_counts,
    hosts_axes,
    loadavg,
    log,
    md_table,
    measured,
    mpi_venv,
    publish,
    ratio,
    run_header,
    ssh_wrapper,
    timed,
    warm_run,
)

SOURCE = SCRIPTS / "tiny_mpi.c"
GOAL = 1.05  # dtlaunch / the hand-written line
SLOTS = 2
HAND = {"openmpi4": "mpirun (by hand)", "mpich": "mpiexec (by hand)"}
MPI_TITLE = {"openmpi4": "Open MPI 4", "mpich": "MPICH"}


def hand_argv(name: str, hosts: list[str], job: str, cfg: str, ssh_dir: Path) -> list[str]:
    """What a user types for that MPI (its defaults otherwise: Open MPI 4 spawns its daemons as
    a tree), with the bed's ssh config."""
    spec = ",".join(f"{h}:{SLOTS}" for h in hosts)
    n = str(SLOTS * len(hosts))
    if name == "mpich":
        return ["mpiexec", "-n", n, "-hosts", spec, "-launcher", "ssh",
                "-launcher-exec", str(ssh_dir / "ssh"), "-iface", "eth0",
                "-genvlist", "PATH,OMP_NUM_THREADS", job]
    return ["mpirun", "--allow-run-as-root", "-np", n, "-H", spec, "--bind-to", "none",
            "--map-by", "slot", "--mca", "pml", "ob1", "--mca", "btl", "self,vader,tcp",
            "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
            "--mca", "plm_rsh_args", f"-F {cfg}", "-x", "PATH", "-x", "OMP_NUM_THREADS", job]


def measure(counts: list[int], reps: int, mpis: list[str], cold: bool, base: str | None = None,
            rev: str = "", prebuilt: Path | None = None,
            only: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"sizes": {}, "load": "", "versions": {}, "rev": rev if base else "",
                           "cores": os.cpu_count() or 1}
    start_load = loadavg()
    tmp = Path(tempfile.mkdtemp(prefix="dtlaunch-bench-scale-"))
    try:
        setups: dict[str, tuple[str, dict[str, str], str]] = {}
        for name in mpis:
            setup = mpi_venv(name)
            if setup is None:
                log(f"{name}: no venv at {VENVS / name}, left out")
                continue
            python, env = setup
            mpicc = "mpicc" if name == "openmpi4" else str(Path(python).parent / "mpicc")
            job = tmp / f"tiny_{name}"
            if prebuilt is not None:
                shutil.copy2(prebuilt / job.name, job)
            else:
                subprocess.run([mpicc, "-O2", "-o", str(job), str(SOURCE)], env=env, check=True)
            setups[name] = (python, env, str(job))
            launcher = "mpiexec" if name == "mpich" else "mpirun"
            version = subprocess.run([launcher, "--version"], env=env, capture_output=True,
                                     text=True).stdout.strip().splitlines()
            found = next((ln.strip() for ln in version if "Version" in ln or "Open MPI" in ln), "?")
            # Hydra prints "Version:   5.0.2"; Open MPI "mpirun (Open MPI) 4.1.4".
            out["versions"][name] = " ".join(found.replace("Version:", "MPICH").split())
        # One bed: h1 is the login host, the job runs on h2..h(N+1).
        with bed_of(max(counts) + 1) as bed, ssh_wrapper(bed.ssh_config) as wrap, \
                cpu_group([h.sshd.pid for h in bed.hosts]) as hosts_group:  # type: ignore[attr-defined]
            cfg = str(bed.ssh_config)  # type: ignore[attr-defined]
            for n in counts:
                hosts = bed.names[1:n + 1]  # type: ignore[attr-defined]
                addrs = [h.address for h in bed.hosts[1:n + 1]]  # type: ignore[attr-defined]
                spec = ",".join(f"{h}:{SLOTS}" for h in hosts)
                tools: dict[str, Callable[[], Sample]] = {}
                caches: list[Path] = []
                for name, (python, env, job) in setups.items():
                    tools.update(_tools(name, bed, python, env, job, hosts, addrs, spec, cfg, wrap,
                                        tmp, caches, cold, hosts_group[1] if hosts_group else None,
                                        base, rev))
                if only:  # the hand-written lines always run: every ratio is to them
                    tools = {k: v for k, v in tools.items()
                             if "by hand" in k or any(o in k for o in only)}
                # Warm-up: every launcher on the smallest size (page cache, Python's bytecode);
                # on the larger ones only the warm pre-flights, which fill their caches.
                first = n == min(counts)
                out["sizes"][n] = measured(tools, reps, f"launch {n} hosts", warmup_only=None
                                           if first else [t for t in tools if "warm" in t])
                for cache in caches:
                    shutil.rmtree(cache, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["load"] = f"{start_load} → {loadavg()}"
    return out


def _tools(name: str, bed: Any, python: str, env: dict[str, str], job: str, hosts: list[str],
           addrs: list[str], spec: str, cfg: str, wrap: Path, tmp: Path, caches: list[Path],
           cold: bool, hosts_cpu: Callable[[], float] | None, base: str | None = None,
           rev: str = "") -> dict[str, Callable[[], Sample]]:
    title = MPI_TITLE[name]
    n = SLOTS * len(hosts)

    def inside(argv: list[str], e: dict[str, str]) -> Sample:
        before = hosts_cpu() if hosts_cpu else 0.0
        sample = timed(bed.nsenter_argv("h1", argv), env=e, watch_rss=True, group_cpu=True,
                       timeout=600)
        sample.hosts_cpu = (hosts_cpu() - before) if hosts_cpu else float("nan")
        if "allreduce over" not in sample.stdout:
            raise RuntimeError(f"{argv[:3]}: no allreduce line in {sample.stdout[-500:]!r}, "
                               f"stderr {sample.stderr[-1500:]!r}")
        return sample

    def warm(dt: list[str], e: dict[str, str]) -> Callable[[], Sample]:
        def run() -> Sample:
            sample, missed = warm_run(lambda: inside(dt, e), e["XDG_CACHE_HOME"])
            if missed:
                log(f"  warning: {dt[3:6]} missed its warm pre-flight cache")
            return sample
        return run

    cache = Path(tempfile.mkdtemp(prefix="dtlaunch-bench-cache-", dir=tmp))
    caches.append(cache)
    warm_env = dict(env, XDG_CACHE_HOME=str(cache))
    # -P: from the repository root, `python -m` would run this checkout whatever PYTHONPATH
    # says (a baseline tree included); see common.dtlaunch_argv.
    dt = [python, "-P", "-m", "dtlaunch", "run", "-v", "-H", spec, "--iface", "eth0", "--ssh-config", cfg]
    tools: dict[str, Callable[[], Sample]] = {
        f"{title}: {HAND[name]}": lambda: inside(hand_argv(name, hosts, job, cfg, wrap), env),
        f"{title}: dtlaunch (warm pre-flight)": warm([*dt, job], warm_env),
    }
    if base:  # dtlaunch as of REV, side by side (its own cache)
        old_cache = Path(tempfile.mkdtemp(prefix="dtlaunch-bench-cache-", dir=tmp))
        caches.append(old_cache)
        old_env = dict(env, XDG_CACHE_HOME=str(old_cache),
                       PYTHONPATH=base + os.pathsep + env["PYTHONPATH"])
        tools[f"{title}: dtlaunch @{rev} (warm pre-flight)"] = warm([*dt, job], old_env)
    if cold and name == "openmpi4":  # one MPI is enough: the checks are the same
        tools[f"{title}: dtlaunch (cold pre-flight)"] = lambda: inside(
            [*dt, job], dict(env, DTLAUNCH_PREFLIGHT_CACHE="0"))
    if name == "openmpi4":
        # Its pre-flight would check every pair of hosts (N x (N-1) logins); see the report.
        tools[f"{title}: dtlaunch --tree-spawn --no-check"] = lambda: inside(
            [*dt, "--tree-spawn", "--no-check", job], env)
    # horovodrun 0.28.1 finds MPICH by the word "MPICH" in `mpirun --version`, which MPICH 5's
    # Hydra no longer prints: it refuses to start ("does not find an installed MPI").
    hvd = horovodrun_path() if name == "openmpi4" else None
    if hvd:
        # horovodrun finds the local host with DNS; the bed's names live only in its ssh config.
        tools[f"{title}: horovodrun"] = lambda: inside(
            [hvd, "-np", str(n), "-H", ",".join(f"{a}:{SLOTS}" for a in addrs),
             "--network-interface", "eth0", "--disable-cache", job], horovodrun_env(env, wrap))
    return tools


def plot(res: dict[str, Any], path: Path) -> None:
    counts = sorted(res["sizes"])
    names = list(res["sizes"][counts[0]]["series"])
    titles = [t for t in MPI_TITLE.values() if any(n.startswith(t + ":") for n in names)]
    with figure(path, nrows=2, ncols=len(titles), figsize=(6 * len(titles), 7.5),
                squeeze=False) as (_, axes):
        for col, title in enumerate(titles):
            for name in (n for n in names if n.startswith(title + ":")):
                label = name.split(": ", 1)[1]
                for row, value in ((0, "median"), (1, "cpu_median")):
                    axes[row][col].plot(counts, [getattr(res["sizes"][c]["series"][name], value)
                                                 for c in counts], "-o", label=label)
            axes[0][col].set_title(f"{title}: tiny MPI job, {SLOTS} ranks per host")
            axes[0][col].set_ylabel("wall time, s (median)")
            axes[1][col].set_ylabel("launcher CPU on the login host, s (median)")
            hosts_axes([axes[0][col], axes[1][col]], counts)


def report(res: dict[str, Any], reps: int, command: str, png: str | None) -> str:
    sizes = sorted(res["sizes"])
    hosts = ", ".join(map(str, sizes[:-1])) + f" and {sizes[-1]}" if len(sizes) > 1 else str(sizes[0])
    parts = [f"## Launch at scale: a tiny MPI job on {hosts} hosts × {SLOTS} slots", "",
             *run_header(command, f"; load average {res['load']} (1, 5, 15 min, start → end).  "),
             "MPIs: " + "; ".join(f"{MPI_TITLE[k]}: {v}" for k, v in res["versions"].items()),
             "", f"Medians of {reps} repetitions (min–max) after a dropped warm-up round; "
             f"ratios to that MPI's hand-written line, of the medians and paired (the median of "
             f"each repetition's own ratio, which the goal is judged on; the warm-up round: every launcher on the "
             f"smallest size, only the warm pre-flights on the others). Goal: dtlaunch ≤ {GOAL:.2f} × at every "
             "size, and its CPU growing no faster than linearly with the hosts.", ""]
    for n in sorted(res["sizes"]):
        size = res["sizes"][n]
        series: dict[str, Series] = size["series"]
        rows = []
        for name, s in series.items():
            title = name.split(":", 1)[0]
            base = next(v for k, v in series.items() if k.startswith(title + ":") and "by hand" in k)
            r = ratio(s.median, base.median)
            # Each repetition's own ratio: load that drifts between repetitions cancels.
            paired = statistics.median(ratio(a, b) for a, b in zip(s.times, base.times))
            mine = "dtlaunch" in name and "cold" not in name and "@" not in name
            goal = ("met" if paired <= GOAL else "MISSED") if mine else ""
            rows.append([name, fmt_s(s), f"{r:.2f}", f"{paired:.2f}", f"{s.median - base.median:+.2f}",
                         f"{s.cpu_median:.2f}", f"{s.cpu_median / n:.3f}",
                         f"{s.hosts_cpu_median:.1f}", f"{s.peak_rss_mib:.0f}", goal])
        parts += [f"**{n} hosts, {SLOTS * n} ranks** (load average {size['load']})", "",
                  md_table(["launcher", "wall s, median (min–max)", "× by hand", "× by hand, paired",
                            "overhead s",
                            "launcher CPU s", "CPU s per host", "hosts' CPU s",
                            "launcher peak RSS MiB",
                            f"goal ≤ {GOAL:.2f}"], rows), ""]
    if png:
        parts += [f"![launch time and launcher CPU against hosts]({png})", ""]
    parts += [
        f"Method: one test bed of {max(res['sizes']) + 1} hosts (network namespaces on a bridge, "
        f"one sshd each, all on this machine's {res.get('cores', 2)} cores); every launcher runs inside h1, which runs no rank, with "
        "`eth0`; the job runs on h2 to h(N+1). Each repetition runs every launcher once, the "
        "order rotating. \"Launcher CPU\" is user + system time of a cgroup holding the "
        "launcher and everything it started on h1 (ssh clients, dtlaunch's ssh agents, Hydra's "
        "local proxy launcher), counted whether or not the processes were reaped; the hosts' "
        "sshd, login shells, daemons and ranks are not in it. RSS is the launcher process's "
        "own VmHWM. \"Hosts' CPU\" is the same for a cgroup holding every host's sshd, and so everything started over ssh (sessions, login shells, MPI daemons, the rank shims, the ranks): the work the launch puts on the hosts, which here share the launcher's cores. The warm pre-flight is a cache hit (refreshed, untimed, when older than "
        "200 s): no login before the launch; the host keys are left to the launcher's ssh "
        "(StrictHostKeyChecking=yes, which refuses an unknown or changed key) and checked "
        "over SSH only if the job fails. The cold one "
        "(`DTLAUNCH_PREFLIGHT_CACHE=0`) runs every check on every host. `--tree-spawn` runs "
        "with `--no-check`: its pre-flight also checks every pair of hosts, N × (N−1) logins "
        "(see \"At scale\" in docs/run.md). The hand-written Open MPI line keeps Open MPI 4's "
        "default tree spawn; dtlaunch turns it off unless `--tree-spawn`. horovodrun 0.28.1 "
        "(`--disable-cache`, so its SSH check runs every time) gets the hosts' addresses and an "
        "`ssh` wrapper that adds the bed's config. horovodrun is not run with MPICH: 0.28.1 "
        "recognises MPICH by the word \"MPICH\" in `mpirun --version`, which MPICH 5's Hydra "
        "no longer prints, and stops with \"horovod does not find an installed MPI\".", ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> str:
    parser = bench_parser(__doc__, reps=3, hosts="8,32,64", out="scale_launch.md",
                          png="scale_launch.png",
                          baseline="also run dtlaunch (warm pre-flight) as of git revision REV")
    parser.add_argument("--mpis", default="openmpi4,mpich")
    parser.add_argument("--no-cold", action="store_true", help="leave out the cold pre-flight")
    parser.add_argument("--prebuilt", type=Path, help="folder of tiny_<mpi> jobs built elsewhere")
    parser.add_argument("--only", help="comma-separated substrings: run only the launchers whose "
                        "names contain one (the hand-written lines always run)")
    args = parser.parse_args(argv)
    with baseline_tree(args.baseline) as base:
        res = measure(host_counts(args.hosts), args.reps, args.mpis.split(","), not args.no_cold,
                      base, args.baseline or "", args.prebuilt,
                      args.only.split(",") if args.only else None)
    command = command_line("scale_launch.py", argv)
    return publish(args.out, res, lambda png: report(res, args.reps, command, png), args.png,
                   lambda path: plot(res, path))


if __name__ == "__main__":
    main()
