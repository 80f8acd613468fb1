"""Run every benchmark of dtlaunch against its peers and write bench/results/RESULTS.md.

    sudo python bench/run_all.py            # full: 5+ repetitions, 2/8-host launches, 1/8/32-host doctor
    sudo python bench/run_all.py --quick    # a few minutes: 3 repetitions, fewer hosts
    sudo python bench/run_all.py --baseline REV   # also dtlaunch as of REV, side by side

Needs root (the multi-host test bed is made of network namespaces), Open MPI, OpenSSH, Horovod
with PyTorch, and optionally matplotlib (the PNG) and netcat (the slow-link proxy).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import time

import doctor_fanout
import launch_overhead
import ptb_ceiling
import ptb_scaling
import recovery_time
import startup
from common import RESULTS, loadavg, log, machine_info, md_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and hosts")
    parser.add_argument("--only", default="startup,launch,doctor",
                        help="comma-separated figures: startup, launch, doctor, ptb, recovery")
    parser.add_argument("--ptb", action="store_true", help="also the PTB scaling and ceiling figures (long)")
    parser.add_argument("--baseline", metavar="REV",
                        help="also measure dtlaunch as of git revision REV (before/after)")
    parser.add_argument("--report-only", action="store_true",
                        help="rebuild RESULTS.md from the last run's files, measuring nothing")
    args = parser.parse_args(argv)
    if args.report_only:
        old = (RESULTS / "RESULTS.md").read_text()
        header = old[: old.index("\n## ")].splitlines() if "\n## " in old else [old]
        write_results(header, [])
        return 0
    if os.geteuid() != 0:
        log("the test bed needs root (network namespaces)")
        return 2
    only = set(args.only.split(",")) | ({"ptb"} if args.ptb else set())
    reps = "3" if args.quick else "5"
    started = time.monotonic()
    load_start = loadavg()
    sections: list[str] = []
    base = ["--baseline", args.baseline] if args.baseline else []
    if "startup" in only:
        sections.append(startup.main(["--reps", "5" if args.quick else "10"]))
    if "launch" in only:
        sections.append(launch_overhead.main(["--reps", reps, "--hosts", "2" if args.quick else "2,8",
                                              "--reps-small", "3" if args.quick else "11", *base]))
    if "doctor" in only:
        sections.append(doctor_fanout.main(["--reps", reps,
                                            "--hosts", "1,8" if args.quick else "1,8,32",
                                            "--latency-hosts", "8" if args.quick else "8,32", *base]))
    if "ptb" in only:
        sections.append(ptb_scaling.main([]))
        sections.append(ptb_ceiling.main([]))
    if "recovery" in only:
        sections.append(recovery_time.main(["--reps", "1" if args.quick else "3"]))
    minutes = (time.monotonic() - started) / 60
    info = machine_info()
    command = "sudo " + " ".join(shlex.quote(a) for a in ["python", "bench/run_all.py", *sys.argv[1:]])
    header = [
        "# dtlaunch benchmarks", "",
        f"Run {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, {minutes:.1f} minutes, "
        f"load average {load_start} at the start and {loadavg()} at the end "
        "(other jobs were running on this machine: compare ratios, not absolute times).", "",
        f"Command: `{command}` (from the repository root, as root).", "",
        md_table(["machine", ""], list(info.items())), "",
        "Every figure runs its tools side by side in one run: round-robin within each "
        "repetition, the order rotating, one warm-up round dropped; medians (min–max) and "
        "ratios. The multi-host test bed (`tests/helpers/testbed.py`) makes each host a network "
        "namespace on one bridge with its own hostname and its own sshd, so every host's sshd "
        "and login shell share this machine's cores.", ""]
    write_results(header, sections)
    log(f"wrote {RESULTS / 'RESULTS.md'} ({minutes:.1f} min)")
    return 0


FIGURES = ("startup", "launch_overhead", "doctor_fanout", "ptb_scaling", "ptb_ceiling")


def memory_section() -> str:
    """Peak RSS of the launchers' own processes, from the raw samples of figures 1 and 2."""
    rows: list[list[object]] = []
    launch = RESULTS / "raw" / "launch_overhead.json"
    if launch.exists():
        for res in json.loads(launch.read_text()):
            for name, s in res["series"].items():
                if name != "mpirun" and s["peak_rss_kib"]:
                    rows.append([f"launch, {res['hosts']} hosts: {name}", f"{max(s['peak_rss_kib']) / 1024:.0f}"])
    doctor = RESULTS / "raw" / "doctor_fanout.json"
    if doctor.exists():
        plain = json.loads(doctor.read_text())["plain"]
        top = max(plain, key=int)
        for name, s in plain[top].items():
            if s["peak_rss_kib"] and max(s["peak_rss_kib"]):
                rows.append([f"{top} hosts: {name}", f"{max(s['peak_rss_kib']) / 1024:.0f}"])
    if not rows:
        return ""
    return "\n".join(["## 5. Memory", "",
                      "Peak resident set (VmHWM) of the launcher's own process, the largest over the "
                      "repetitions (mpirun, ssh clients, probes and ranks are separate processes and "
                      "not included):", "", md_table(["what", "peak RSS MiB"], rows), ""])


def write_results(header: list[str], sections: list[str]) -> None:
    """RESULTS.md: header, each figure's section (from this run, or the files it wrote), memory,
    and the profiling notes (bench/profiling.md)."""
    if not sections:
        sections = [(RESULTS / f"{name}.md").read_text() for name in FIGURES
                    if (RESULTS / f"{name}.md").exists()]
    sections = sorted(sections, key=lambda text: text.split("## ", 1)[-1][:3])  # by figure number
    extra = [memory_section()]
    notes = RESULTS.parent / "profiling.md"
    if notes.exists():
        extra.append(notes.read_text())
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "RESULTS.md").write_text("\n".join([*header, *sections, *[e for e in extra if e]]))


if __name__ == "__main__":
    sys.exit(main())
