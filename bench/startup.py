"""Figure 3: start-up. `dtlaunch --help` and `dtlaunch run --dry-run ...` vs `horovodrun --help`,
with `python -c pass` as the floor, round-robin. Also lists which heavy modules (paramiko, rich,
torch, horovod) each dtlaunch command imports.

    python bench/startup.py [--reps 10]
"""

from __future__ import annotations

from typing import Any

from common import (
    PYTHON,
    TINY_JOB,
    Series,
    bench_parser,
    dtlaunch_argv,
    fmt_s,
    horovodrun_path,
    md_table,
    measured,
    ratio,
    save_raw,
    timed,
    worktree_env,
    write_result,
)

GOAL = 0.15  # seconds
HEAVY = ("paramiko", "rich", "torch", "horovod", "cryptography", "psutil")
DRY_RUN = ("run", "--dry-run", "-H", "h1:1,h2:1", "--iface", "eth0", TINY_JOB)


def heavy_imports(args: tuple[str, ...]) -> list[str]:
    """Top-level heavy packages a dtlaunch command imports (python -X importtime)."""
    sample = timed([PYTHON, "-X", "importtime", "-m", "dtlaunch", *args], env=worktree_env())
    found = set()
    for line in sample.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip().split(".")[0]
            if name in HEAVY:
                found.add(name)
    return sorted(found)


def measure(reps: int) -> dict[str, Any]:
    env = worktree_env()
    tools = {
        "python -c pass (floor)": lambda: timed([PYTHON, "-c", "pass"], env=env),
        "dtlaunch --help": lambda: timed(dtlaunch_argv("--help"), env=env, watch_rss=True),
        "dtlaunch run --dry-run": lambda: timed(dtlaunch_argv(*DRY_RUN), env=env, watch_rss=True),
    }
    hvd = horovodrun_path()
    if hvd:
        tools["horovodrun --help"] = lambda: timed([hvd, "--help"], env=env, watch_rss=True)
    return {**measured(tools, reps, "start-up"),
            "heavy": {"--help": heavy_imports(("--help",)), "run --dry-run": heavy_imports(DRY_RUN)}}


def report(res: dict[str, Any], reps: int) -> str:
    series: dict[str, Series] = res["series"]
    hvd = series.get("horovodrun --help")
    rows = []
    for name, s in series.items():
        goal = ""
        if name.startswith("dtlaunch"):
            goal = "met" if s.median <= GOAL else "MISSED"
        rows.append([name, fmt_s(s), f"{ratio(s.median, hvd.median):.2f}" if hvd else "–",
                     f"{s.peak_rss_mib:.0f}" if s.peak_rss_mib else "–", goal])
    heavy = res["heavy"]
    return "\n".join([
        "## 3. Start-up", "",
        f"Medians of {reps} repetitions (min–max), load average {res['load']}. "
        f"Goal: ≤ {GOAL} s.", "",
        md_table(["command", "wall s, median (min–max)", "× horovodrun --help", "peak RSS MiB",
                  f"goal ≤ {GOAL} s"], rows), "",
        "Heavy modules imported: `dtlaunch --help`: "
        f"{', '.join(heavy['--help']) or 'none'}; `dtlaunch run --dry-run`: "
        f"{', '.join(heavy['run --dry-run']) or 'none'} (of {', '.join(HEAVY)}). "
        "`run --dry-run` also runs `mpirun --version` once.", "",
        "dtlaunch runs from this checkout (`python -m dtlaunch`, `PYTHONPATH` set); the Python "
        "here starts every process with an editable-install finder from its site-packages "
        "(part of the floor).", ""])


def main(argv: list[str] | None = None) -> str:
    args = bench_parser(__doc__, reps=10).parse_args(argv)
    res = measure(args.reps)
    text = report(res, args.reps)
    save_raw("startup", res)
    return write_result("startup.md", text)


if __name__ == "__main__":
    main()
