"""dtlaunch's fixed cost per job, no hosts: the same 2-rank job on this machine (`-H
localhost:2`, no ssh, no rank program of its own: `/bin/true`) started by the hand-written
`mpirun` line and by `dtlaunch run` (`--no-check`, and with its pre-flight warm: a cache hit),
the variants taking turns. What dtlaunch adds here is what it adds to every job whatever the
hosts: its own start (Python, its imports, `mpirun --version`, the plan, the pre-flight cache),
the lifeline that mpirun starts under, the rank shim around each rank, and its end (the output
drained, the session swept). With `--baseline REV`, dtlaunch as of REV beside this checkout.

    python bench/fixed_cost.py --reps 15 --baseline REV
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    Sample,
    Series,
    baseline_env,
    baseline_tree,
    bench_parser,
    command_line,
    dtlaunch_argv,
    loadavg,
    md_table,
    round_robin,
    run_header,
    save_raw,
    timed,
    worktree_env,
    write_result,
)

JOB = ("-np", "2", "-H", "localhost:2")
HAND = ["mpirun", "--allow-run-as-root", *JOB, "--bind-to", "none", "/bin/true"]


def measure(reps: int, base: str | None, rev: str) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="dtlaunch-bench-fixed-"))
    try:
        trees: dict[str, dict[str, str]] = {"": worktree_env()}
        if base:
            trees[f" @{rev}"] = baseline_env(base)
        tools: dict[str, Callable[[], Sample]] = {
            "mpirun (by hand)": lambda: timed(HAND, env=trees[""])}
        for label, env in trees.items():
            cache = tmp / f"cache{len(tools)}"
            warm = dict(env, XDG_CACHE_HOME=str(cache))
            # Fill the warm variant's cache (5 minutes: this run is far shorter).
            timed(dtlaunch_argv("run", *JOB, "/bin/true"), env=warm)
            tools[f"dtlaunch{label} --no-check"] = (
                lambda e=env: timed(dtlaunch_argv("run", *JOB, "--no-check", "/bin/true"), env=e,
                                    watch_rss=True))
            tools[f"dtlaunch{label} (warm pre-flight)"] = (
                lambda e=warm: timed(dtlaunch_argv("run", *JOB, "/bin/true"), env=e,
                                     watch_rss=True))
        before = loadavg()
        series = round_robin(tools, reps, warmup=1, label="fixed cost")
        return {"series": series, "load": f"{before} → {loadavg()}"}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def report(res: dict[str, Any], reps: int, command: str) -> str:
    series: dict[str, Series] = res["series"]
    hand = series["mpirun (by hand)"]
    rows = []
    for name, s in series.items():
        low, high = s.spread
        rows.append([name, f"{s.median:.3f} ({low:.3f}–{high:.3f})",
                     f"{s.median - hand.median:+.3f}", f"{s.cpu_median:.3f}",
                     f"{s.cpu_median - hand.cpu_median:+.3f}",
                     f"{s.peak_rss_mib:.0f}" if s.peak_rss_mib else "–"])
    return "\n".join([
        "## dtlaunch's fixed cost per job (no hosts)", "",
        *run_header(command, f"; load average {res['load']} (1, 5, 15 min, start → end).  "), "",
        f"`-np 2 -H localhost:2 /bin/true`; medians of {reps} repetitions (min–max) after a "
        "dropped warm-up round, the variants taking turns. CPU is user + system of the "
        "command and everything it started (wait4 of the children).", "",
        md_table(["launcher", "wall s, median (min–max)", "wall added s", "CPU s",
                  "CPU added s", "peak RSS MiB"], rows), "",
        "What is added here is added to every job, whatever its hosts: dtlaunch's start "
        "(interpreter, imports, `mpirun --version`, the plan, the pre-flight cache read), "
        "the lifeline mpirun starts under, a rank shim around each of the 2 ranks, and the end "
        "(output drained, mpirun's session swept). Paired: "
        + "; ".join(f"{name} {statistics.median(pairs):.2f} × by hand"
                    for name, pairs in paired(series).items()) + ".", ""])


def paired(series: dict[str, Series]) -> dict[str, list[float]]:
    """Each repetition's own ratio to the hand-written line (the same round)."""
    hand = series["mpirun (by hand)"].times
    return {name: [t / h for t, h in zip(s.times, hand, strict=False)]
            for name, s in series.items() if name != "mpirun (by hand)"}


def main(argv: list[str] | None = None) -> str:
    parser = bench_parser(__doc__, reps=15, out="fixed_cost.md",
                          baseline="also measure dtlaunch as of git revision REV")
    args = parser.parse_args(argv)
    with baseline_tree(args.baseline) as base:
        res = measure(args.reps, base, args.baseline or "")
    save_raw(args.out.removesuffix(".md"), res)
    return write_result(args.out, report(res, args.reps, command_line("fixed_cost.py", argv)))


if __name__ == "__main__":
    main()
