"""Figure: output throughput. One rank on test-bed host h2 prints 100 MB of 'x', in lines of 100
bytes and in one line without a newline; launched from inside h1 by the hand-written mpirun line
(what `dtlaunch run --dry-run` prints) and by dtlaunch. A reader on the launcher's stdout counts
the bytes as fast as they come (so a lost byte shows up).

    python bench/output_throughput.py [--reps 3] [--mb 100]
"""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
import time
from typing import Any

from common import (
    SCRIPTS,
    Sample,
    Series,
    _watch_hwm,
    bed_of,
    bench_parser,
    dtlaunch_argv,
    fmt_s,
    md_table,
    measured,
    publish,
    ratio,
    worktree_env,
)

JOB = str(SCRIPTS / "print_mb.py")
GOAL_RATIO = 0.8  # dtlaunch's throughput / mpirun's
GOAL_RSS_MIB = 64


def streamed(argv: list[str], env: dict[str, str], expect: int) -> Sample:
    """Run argv; count its stdout's 'x' in a reader thread; VmHWM of the process started."""
    stop = threading.Event()
    box = [0]
    counted = [0]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    watcher = threading.Thread(target=_watch_hwm, args=(proc.pid, stop, box), daemon=True)
    watcher.start()
    err: list[bytes] = []
    drain = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    drain.start()
    fd = proc.stdout.fileno()
    while True:
        data = os.read(fd, 1 << 20)
        if not data:
            break
        counted[0] += data.count(b"x")
    proc.wait(timeout=600)
    seconds = time.perf_counter() - start
    stop.set()
    drain.join(5)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)[:300]} exited {proc.returncode}: {b''.join(err)[-2000:]!r}")
    return Sample(seconds, proc.returncode, box[0], 0.0, f"{counted[0]}/{expect}", "")


def measure(reps: int, mb: float) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with bed_of(2) as bed:
        cfg = str(bed.ssh_config)  # type: ignore[attr-defined]
        env = worktree_env()
        common = ["-H", "h2:1", "--iface", "eth0", "--ssh-config", cfg]
        for mode in ("lines", "line"):
            expect = int(mb * 1000 * 1000) * (99 if mode == "lines" else 100) // 100
            shown = subprocess.run(dtlaunch_argv("run", "--dry-run", *common, JOB, mode, str(mb)),
                                   env=env, capture_output=True, text=True, check=True).stdout
            by_hand = shlex.split(shown)
            # The line starts with the variables mpirun needs (NAME=value), as a shell reads it.
            hand_env = dict(env)
            while by_hand and "=" in by_hand[0] and not by_hand[0].startswith("-"):
                name, value = by_hand.pop(0).split("=", 1)
                hand_env[name] = value

            def inside(argv: list[str], e: int = expect, with_env: dict[str, str] = env) -> Sample:
                return streamed(bed.nsenter_argv("h1", argv), with_env, e)  # type: ignore[attr-defined]

            tools = {
                "mpirun": lambda a=by_hand, h=hand_env: inside(a, with_env=h),
                "dtlaunch --no-check": lambda m=mode: inside(dtlaunch_argv(
                    "run", "--no-check", *common, JOB, m, str(mb))),
            }
            res = measured(tools, reps, f"output {mode}")
            results[mode] = {**res, "mb": mb, "received": {
                n: [s.stdout for s in v.samples] for n, v in res["series"].items()}}
    return results


def report(results: dict[str, Any]) -> str:
    parts = ["## Output throughput: one rank printing to the launcher", "",
             "One rank on h2, launched from inside h1; a reader counts the launcher's stdout. "
             f"Goal: dtlaunch ≥ {GOAL_RATIO:.1f} × mpirun's throughput, dtlaunch's peak RSS ≤ "
             f"{GOAL_RSS_MIB} MiB.", ""]
    for mode, res in results.items():
        series: dict[str, Series] = res["series"]
        base = series["mpirun"].median
        rows = []
        for name, s in series.items():
            throughput = res["mb"] / s.median
            r = ratio(base, s.median)
            rss = s.peak_rss_mib
            goal = ""
            if name != "mpirun":
                goal = "met" if r >= GOAL_RATIO and rss <= GOAL_RSS_MIB else "MISSED"
            rows.append([name, fmt_s(s), f"{throughput:.1f}", f"{r:.2f}", f"{rss:.0f}",
                         ", ".join(res["received"][name]), goal])
        label = "in lines of 100 bytes" if mode == "lines" else "in one line, no newline"
        parts += [f"**{res['mb']:g} MB {label}** ({len(series['mpirun'].samples)} repetitions, "
                  f"load average {res['load']})", "",
                  md_table(["launcher", "wall s, median (min–max)", "MB/s", "× mpirun throughput",
                            "launcher peak RSS MiB", "bytes received / printed", "goal"], rows), ""]
    parts += ["Method: each repetition runs both launchers, the order rotating, one warm-up round "
              "dropped. The mpirun line is the one `dtlaunch run --dry-run` prints (with "
              "`--tag-output`), so the difference is the rank shim and dtlaunch's reading of the "
              "output. RSS is the launcher process's own VmHWM (mpirun's is not sampled). "
              "\"bytes received\" counts the 'x' that reached the reader.", ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> str:
    parser = bench_parser(__doc__, reps=3, out="output_throughput.md")
    parser.add_argument("--mb", type=float, default=100.0)
    args = parser.parse_args(argv)
    results = measure(args.reps, args.mb)
    return publish(args.out, results, lambda png: report(results))


if __name__ == "__main__":
    main()
