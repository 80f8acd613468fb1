"""Figure: the CPU of one start of each per-host or per-rank program dtlaunch runs, no hosts.

- Open MPI's ssh agent (`python -I -S agents/rsh.py HOST true`, once per host beside mpirun),
- Hydra's agent file (the same agent through the `-launcher-exec` file dtlaunch writes),
- the rank shim (`wrap_program(["/bin/true"], python3)`, once per rank on the hosts),
- the probe's Python half (`remote_probe.py` with the import cache warm, once per host in doctor
  and a cold pre-flight),

each against a bare `python -I -S` (the interpreter's own start, the floor of a Python agent).
`ssh` is a stand-in (a shell script that writes ssh's first log line and the remote command's
exit status, as `ssh -v -E LOG` does), so no network or host is involved. Each start is one
child's own user + system time (wait4, its reaped children included); the variants take turns,
so a load spike hits all of them alike; medians and minimums. With `--baseline REV`, dtlaunch
as of REV runs beside this checkout.

    python bench/agent_cpu.py [--reps 40] [--baseline REV]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import (
    ROOT,
    baseline_tree,
    bench_parser,
    command_line,
    loadavg,
    md_table,
    run_header,
    write_result,
)

FAKE_SSH = ('#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = -E ] && log=$2; shift; done\n'
            '[ -n "$log" ] && printf "OpenSSH_fake\\ndebug1: rtype exit-status 0\\n" >> "$log"\n'
            "exit 0\n")
RANK_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable

BUILD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from dtlaunch import agents
from dtlaunch.agents.rank_shim import wrap_program
from dtlaunch.hydra.family import agent_script
# agents.ship(name) today; agents.path/text in trees before it (a --baseline).
def _file(name):
    return agents.ship(name).file if hasattr(agents, "ship") else agents.path(name)
def _text(name):
    return agents.ship(name).text if hasattr(agents, "ship") else agents.text(name)
agent = os.path.join(sys.argv[2], "hydra-agent")
with open(agent, "w") as f:
    f.write(agent_script(sys.executable, _file("rsh.py"), ["-o", "BatchMode=yes"]))
os.chmod(agent, 0o700)
print(json.dumps({
    "rsh": [sys.executable, "-I", "-S", _file("rsh.py"), "h2", "true"],
    "hydra": [agent, "-x", "h2", "true"],
    "shim": list(wrap_program(["/bin/true"], sys.argv[3])),
    "probe": [sys.executable, "-c", _text("remote_probe.py"), "", "", "1",
              _text("import_probe.py")],
}))
"""


def programs(tree: str, folder: Path) -> dict[str, list[str]]:
    folder.mkdir(parents=True, exist_ok=True)
    out = subprocess.run([sys.executable, "-c", BUILD, tree, str(folder), RANK_PYTHON],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)  # type: ignore[no-any-return]


def child_cpu(argv: list[str], env: dict[str, str]) -> float:
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:4]} exited {proc.returncode}")
    return (usage.ru_utime + usage.ru_stime) * 1000


def measure(reps: int, base: str | None, rev: str) -> dict[str, dict[str, list[float]]]:
    tmp = Path(tempfile.mkdtemp(prefix="dtlaunch-bench-agents-"))
    try:
        (tmp / "bin").mkdir()
        (tmp / "bin" / "ssh").write_text(FAKE_SSH)
        (tmp / "bin" / "ssh").chmod(0o755)
        env = dict(os.environ, PATH=f"{tmp / 'bin'}{os.pathsep}{os.environ['PATH']}",
                   TMPDIR=str(tmp), OMPI_COMM_WORLD_RANK="0", XDG_CACHE_HOME=str(tmp / "cache"))
        trees = {"this checkout": str(ROOT)}
        if base:
            trees[f"@{rev}"] = base
        variants: dict[tuple[str, str], list[str]] = {}
        for label, tree in trees.items():
            for kind, argv in programs(tree, tmp / label.strip("@ ")).items():
                variants[(kind, label)] = argv
        variants[("bare", "python -I -S")] = [sys.executable, "-I", "-S", "-c", "pass"]
        variants[("bare", "rank python -I -S")] = [RANK_PYTHON, "-I", "-S", "-c", "pass"]
        found: dict[str, dict[str, list[float]]] = {}
        for rep in range(reps + 1):  # the first round fills caches (byte code, the probe's)
            for (kind, label), argv in variants.items():
                cpu = child_cpu(argv, env)
                if rep:
                    found.setdefault(kind, {}).setdefault(label, []).append(cpu)
        return found
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


TITLES = {"rsh": "Open MPI's ssh agent (once per host)",
          "hydra": "Hydra's agent file (once per host)",
          "shim": f"rank shim under {RANK_PYTHON} (once per rank)",
          "probe": "probe's Python half, import cache warm (once per host)",
          "bare": "a bare interpreter start"}


def report(found: dict[str, dict[str, list[float]]], reps: int, command: str,
           load: str) -> str:
    rows = []
    for kind, title in TITLES.items():
        for label, values in found.get(kind, {}).items():
            rows.append([title, label, f"{statistics.median(values):.1f}", f"{min(values):.1f}"])
    return "\n".join([
        "## CPU of one start of each per-host and per-rank program", "",
        *run_header(command, f"; load average {load} (1, 5, 15 min, start → end).  "), "",
        f"User + system CPU of one start, ms: median and minimum of {reps} starts per variant, "
        "the variants taking turns.", "",
        md_table(["program", "dtlaunch", "median ms", "min ms"], rows), "",
        "Method: no hosts; `ssh` is a stand-in script that writes the log lines `ssh -v -E` "
        "writes, so the figure is the agent's own start, work and exit (its stand-in ssh "
        "included, ~0.6 ms). Each start's CPU comes from wait4 (the child and what it reaped). "
        "The shim runs `/bin/true`; the probe's half reads its import cache, warm after the "
        "first round, which is dropped.", ""])


def main(argv: list[str] | None = None) -> str:
    parser = bench_parser(__doc__, reps=40, out="agent_cpu.md",
                          baseline="also measure dtlaunch as of git revision REV")
    args = parser.parse_args(argv)
    before = loadavg()
    with baseline_tree(args.baseline) as base:
        found = measure(args.reps, base, args.baseline or "")
    return write_result(args.out, report(found, args.reps, command_line("agent_cpu.py", argv),
                                         f"{before} → {loadavg()}"))


if __name__ == "__main__":
    main()
