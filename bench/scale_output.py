"""Output at scale: every rank of a job on 8 to 64 test-bed hosts x 2 slots prints 10,000
numbered lines of 64 bytes (`scripts/print_lines.py`); launched from a login host (h1, no rank
there) by the hand-written `mpirun --tag-output` line and by `dtlaunch run`, side by side. The
launcher's stdout goes to a file, read afterwards: every line must arrive, once, under the tag
of the rank that wrote it (and, for dtlaunch, that rank's host).

    python bench/scale_output.py [--reps 2] [--hosts 8,32,64] [--lines 10000]
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    PYTHON,
    SCRIPTS,
    Sample,
    Series,
    bed_of,
    bench_parser,
    command_line,
    cpu_group,
    dtlaunch_argv,
    figure,
    fmt_s,
    host_counts,
    hosts_axes,
    loadavg,
    md_table,
    measured,
    publish,
    ratio,
    run_header,
    timed,
    worktree_env,
)

JOB = str(SCRIPTS / "print_lines.py")
SLOTS = 2
LINE = 64
GOAL_RSS_MIB = 128
DT_LINE = re.compile(rb"^\[(\d+)@([^\]]+)\] rank (\d+) line (\d+) x*$")
MPI_LINE = re.compile(rb"^\[1,(\d+)\]<stdout>:rank (\d+) line (\d+) x*$")


def check(path: Path, hosts: list[str], lines: int, dtlaunch: bool) -> str:
    """'ok', or what is wrong with the received lines."""
    ranks = SLOTS * len(hosts)
    seen: Counter[int] = Counter()
    numbers = [0] * ranks
    wrong = broken = 0
    with path.open("rb") as handle:
        for raw in handle:
            match = (DT_LINE if dtlaunch else MPI_LINE).match(raw.rstrip(b"\n"))
            if match is None:
                # A launcher's own line (a warning), or a rank's line cut by another tag.
                broken += b" line " in raw
                continue
            if dtlaunch:
                tag, host, rank, number = match.groups()
                # --map-by slot: ranks 2k and 2k+1 run on the job's k-th host.
                if host.decode() != hosts[int(tag) // SLOTS]:
                    wrong += 1
            else:
                tag, rank, number = match.groups()
            if tag != rank:
                wrong += 1
                continue
            r = int(rank)
            seen[r] += 1
            numbers[r] += int(number)
    expect_sum = lines * (lines - 1) // 2
    short = [r for r in range(ranks) if seen[r] != lines or numbers[r] != expect_sum]
    if wrong or short or broken:
        return (f"{broken} lines cut by a tag, {wrong} mistagged, {len(short)} of {ranks} ranks "
                "short of intact lines")
    return "ok"


def measure(counts: list[int], reps: int, lines: int) -> dict[str, Any]:
    out: dict[str, Any] = {"sizes": {}, "lines": lines}
    start_load = loadavg()
    tmp = Path(tempfile.mkdtemp(prefix="dtlaunch-bench-output-"))
    try:
        return _measure(counts, reps, lines, out, start_load, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _measure(counts: list[int], reps: int, lines: int, out: dict[str, Any], start_load: str,
             tmp: Path) -> dict[str, Any]:
    with bed_of(max(counts) + 1) as bed, \
            cpu_group([h.sshd.pid for h in bed.hosts]) as hosts_group:  # type: ignore[attr-defined]
        cfg = str(bed.ssh_config)  # type: ignore[attr-defined]
        env = worktree_env()
        for n in counts:
            hosts: list[str] = bed.names[1:n + 1]  # type: ignore[attr-defined]
            spec = ",".join(f"{h}:{SLOTS}" for h in hosts)
            verdicts: dict[str, list[str]] = {}

            def inside(name: str, argv: list[str], dtlaunch: bool, hosts: list[str] = hosts,
                       verdicts: dict[str, list[str]] = verdicts) -> Sample:
                sink = tmp / "stdout"
                before = hosts_group[1]() if hosts_group else 0.0
                sample = timed(["sh", "-c", 'exec "$@" > "$0"', str(sink),
                                *bed.nsenter_argv("h1", argv)],  # type: ignore[attr-defined]
                               env=env, group_cpu=True, watch_rss=True, timeout=900)
                sample.hosts_cpu = (hosts_group[1]() - before) if hosts_group else float("nan")
                sample.stdout = check(sink, hosts, lines, dtlaunch)
                verdicts.setdefault(name, []).append(sample.stdout)
                sink.unlink()
                return sample

            mpirun = ["mpirun", "--allow-run-as-root", "--tag-output", "-np", str(SLOTS * n),
                      "-H", spec, "--bind-to", "none", "--map-by", "slot", "--mca", "pml", "ob1",
                      "--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_if_include", "eth0",
                      "--mca", "oob_tcp_if_include", "eth0", "--mca", "plm_rsh_args", f"-F {cfg}",
                      "-x", "PATH", "-x", "PYTHONPATH", PYTHON, JOB, str(lines)]
            dt = dtlaunch_argv("run", "--no-check", "-H", spec, "--iface", "eth0",
                               "--ssh-config", cfg, JOB, str(lines))
            tools: dict[str, Callable[[], Sample]] = {
                "mpirun --tag-output (by hand)": lambda a=mpirun: inside(
                    "mpirun --tag-output (by hand)", a, False),
                "dtlaunch run --no-check": lambda a=dt: inside("dtlaunch run --no-check", a, True),
            }
            out["sizes"][n] = {**measured(tools, reps, f"output {n} hosts"),
                               "verdicts": {k: v[-reps:] for k, v in verdicts.items()},
                               "mb": SLOTS * n * lines * LINE / 1e6}
    out["load"] = f"{start_load} → {loadavg()}"
    return out


def plot(res: dict[str, Any], path: Path) -> None:
    counts = sorted(res["sizes"])
    with figure(path, ncols=2, figsize=(11, 4.2)) as (fig, axes):
        for name in res["sizes"][counts[0]]["series"]:
            for ax, value in zip(axes, ("median", "cpu_median")):
                ax.plot(counts, [getattr(res["sizes"][c]["series"][name], value) for c in counts],
                        "-o", label=name)
        axes[0].set_ylabel("wall time, s (median)")
        axes[1].set_ylabel("launcher CPU, s (median)")
        hosts_axes(axes, counts, f"hosts ({SLOTS} ranks each, {res['lines']:,} lines of {LINE} "
                   "bytes per rank)")
        fig.suptitle("Output at scale: every rank prints to the launcher")


def report(res: dict[str, Any], reps: int, command: str, png: str | None) -> str:
    parts = ["## Output at scale: every rank prints 10,000 lines", "",
             *run_header(command, f"; load average {res['load']} (start → end)."), "",
             f"Medians of {reps} repetitions (min–max) after one dropped warm-up round. Goal: "
             f"every line arrives under the right tag, dtlaunch's peak RSS ≤ {GOAL_RSS_MIB} MiB; "
             "its CPU per MB stated.", ""]
    for n in sorted(res["sizes"]):
        size = res["sizes"][n]
        series: dict[str, Series] = size["series"]
        base = series["mpirun --tag-output (by hand)"]
        rows = []
        for name, s in series.items():
            rss = s.peak_rss_mib
            goal = ""
            ok = all(v == "ok" for v in size["verdicts"][name])
            if name.startswith("dtlaunch"):
                goal = "met" if ok and rss <= GOAL_RSS_MIB else "MISSED"
            rows.append([name, fmt_s(s), f"{ratio(s.median, base.median):.2f}",
                         f"{size['mb'] / s.median:.1f}", f"{s.cpu_median:.2f}",
                         f"{s.cpu_median / size['mb'] * 1000:.1f}", f"{s.hosts_cpu_median:.1f}",
                         f"{rss:.0f}", ", ".join(size["verdicts"][name]), goal])
        parts += [f"**{n} hosts, {SLOTS * n} ranks, {size['mb']:.0f} MB** (load average "
                  f"{size['load']})", "",
                  md_table(["launcher", "wall s, median (min–max)", "× mpirun", "MB/s",
                            "launcher CPU s", "launcher CPU ms per MB", "hosts' CPU s",
                            "launcher peak RSS MiB", "every line, right tag", "goal"], rows), ""]
    if png:
        parts += [f"![output at scale]({png})", ""]
    parts += [
        "Method: one test bed (network namespaces, one sshd each, all on this machine's 2 "
        "cores); both launchers run inside h1 (no rank there) with `eth0`, the job on h2 to "
        "h(N+1), `--map-by slot`. Each repetition runs both, the order rotating. The "
        "launcher's stdout goes to a file; afterwards every line is parsed: its tag's rank "
        "must be the rank named in the line (and, for dtlaunch, the tag's host the host that "
        "rank ran on), and every rank's lines 0 to 9,999 must all be there, whole. Open MPI's `--tag-output` "
        "tags what each read of a rank's output returned, so a line that straddles two reads "
        "(4 KiB here, every 64th line of 64 bytes) comes out cut, with a second tag in its "
        "middle; that is counted, not fixed. \"Launcher CPU\" "
        "is user + system time of a cgroup holding the launcher and all it started on h1 "
        "(ssh clients, dtlaunch's ssh agents); \"hosts' CPU\" the same for every host's sshd "
        "and what it started (MPI daemons, rank shims, ranks). Peak RSS is the launcher process's own VmHWM "
        "(for dtlaunch its Python process, which reads and tags every line, not the mpirun it "
        "starts; for the hand-written line mpirun). dtlaunch runs with `--no-check`, so the figure is its "
        "output path, not its pre-flight.", ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> str:
    parser = bench_parser(__doc__, reps=2, hosts="8,32,64", out="scale_output.md",
                          png="scale_output.png")
    parser.add_argument("--lines", type=int, default=10000)
    args = parser.parse_args(argv)
    res = measure(host_counts(args.hosts), args.reps, args.lines)
    command = command_line("scale_output.py", argv)
    return publish(args.out, res, lambda png: report(res, args.reps, command, png), args.png,
                   lambda path: plot(res, path))


if __name__ == "__main__":
    main()
