"""Figure: what the Gloo fan-out's own process costs (dtlaunch.agents.gloo_start, started under
the lifeline between dtlaunch and the per-host links), paired against a prototype without it.

- Launch: the tiny Horovod job (init + one allreduce) on 2 test-bed hosts with `--gloo
  --no-check`, from inside h1 (h1's agent runs there, h2's over ssh), each repetition run
  once as dtlaunch is and once with bench/scripts/nohop on PYTHONPATH: a throwaway prototype
  that forks dtlaunch and runs gloo_start's main() in the child (no new interpreter, no
  import, no lifeline: the links start from dtlaunch's own image), the order alternating.
  From /proc (start times, 10 ms ticks): when the fan-out's process began and when its last
  link (rsh.py, or the local host's agent) began, after dtlaunch's start; the wall time.
- During a job: gloo_start's RSS and USS (psutil, once the links are up) and its CPU over the
  tiny job, and per second over a job whose 2 ranks print 20 lines/s for 8 s.
- Start: `python -X importtime -I -S gloo_start.py`, and the wall time of gloo_start's and
  the lifeline's start (each exits at once on empty input) against a bare `python -I -S`.

    python bench/gloo_hop.py [--reps 6]
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import psutil
from common import (
    PYTHON,
    ROOT,
    SCRIPTS,
    TINY_JOB,
    bench_parser,
    command_line,
    dtlaunch_argv,
    loadavg,
    log,
    md_table,
    publish,
    resolving_bed,
    run_header,
    worktree_env,
)

NOHOP = SCRIPTS / "nohop"  # the prototype's sitecustomize
AGENTS = ROOT / "dtlaunch" / "agents"
TICK = os.sysconf("SC_CLK_TCK")
HOP, PROTO = "dtlaunch --gloo (gloo_start)", "prototype: fan-out forked from dtlaunch"
CHATTY = ("import sys, time\nfor i in range(160):\n    print('line', i, flush=True)\n"
          "    time.sleep(0.05)\n")


@dataclass
class Run:
    wall: float
    fanout_at: float = float("nan")  # s after dtlaunch's start, from /proc start times
    links_at: float = float("nan")  # the last link's start
    links: int = 0
    cpu: float = float("nan")  # the fan-out process's own user + system seconds, last seen
    cpu_after_links: float = float("nan")  # ... when the links were all up
    seen_s: float = float("nan")  # monotonic seconds between those two looks
    rss_mib: float = float("nan")
    uss_mib: float = float("nan")
    hop: bool = False  # the fan-out was gloo_start (not the prototype's fork)


def started(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[19]) / TICK


def own_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def watch(root: int, done: threading.Event, run: Run, want_links: int) -> None:
    """Find the fan-out (the parent of the rsh.py link) and its links; note times and sizes."""
    t0 = started(root)
    fanout: psutil.Process | None = None
    links: dict[int, float] = {}
    up_at = None
    while not done.is_set():
        try:
            if fanout is None:
                for p in psutil.Process(root).children(recursive=True):
                    if any("rsh.py" in w for w in p.cmdline()):
                        fanout = psutil.Process(p.ppid())
                        run.fanout_at = started(fanout.pid) - t0
                        run.hop = any("gloo_start.py" in w for w in fanout.cmdline())
                        break
            if fanout is not None:
                for child in fanout.children():
                    if child.pid not in links and "lifeline.py" not in " ".join(child.cmdline()):
                        links[child.pid] = started(child.pid) - t0
                run.links, run.links_at = len(links), max(links.values(), default=float("nan"))
                run.cpu = own_cpu(fanout.pid)
                if up_at is None and len(links) >= want_links:
                    up_at = time.monotonic()
                    run.cpu_after_links = run.cpu
                    mem = fanout.memory_full_info()
                    run.rss_mib, run.uss_mib = mem.rss / 2**20, mem.uss / 2**20
                if up_at is not None:
                    run.seen_s = time.monotonic() - up_at
        except (psutil.Error, OSError):
            pass
        done.wait(0.05 if up_at is None else 0.2)


def one(argv: list[str], env: dict[str, str], hop: bool = True) -> Run:
    begin = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd="/tmp", stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    run = Run(0.0)
    done = threading.Event()
    watcher = threading.Thread(target=watch, args=(proc.pid, done, run, 2), daemon=True)
    watcher.start()
    out, err = proc.communicate(timeout=300)
    run.wall = time.perf_counter() - begin
    done.set()
    watcher.join(2)
    if proc.returncode != 0 or run.links != 2 or run.hop != hop:
        raise RuntimeError(f"exit {proc.returncode}, {run.links} links seen, gloo_start "
                           f"{run.hop}:\n{out[-1500:]}\n"
                           f"{err[-2500:]}")
    return run


def interpreter_starts(reps: int) -> dict[str, Any]:
    """importtime of gloo_start, and the wall time of three starts that end at once, in turns."""
    bare = [PYTHON, "-I", "-S", "-c", "pass"]
    fanout = [PYTHON, "-I", "-S", str(AGENTS / "gloo_start.py")]  # empty input: exits 2
    guard = [PYTHON, "-I", "-S", str(AGENTS / "lifeline.py")]  # no arguments: usage, exits 2
    walls: dict[str, list[float]] = {"python -I -S -c pass": [], "gloo_start.py": [],
                                     "lifeline.py": []}
    for _ in range(reps):
        for name, argv in zip(walls, (bare, fanout, guard)):
            begin = time.perf_counter()
            subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, check=False)
            walls[name].append(time.perf_counter() - begin)
    imports = []
    for _ in range(reps):
        err = subprocess.run([PYTHON, "-X", "importtime", *fanout[1:]], stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, check=False).stderr
        # Top-level imports only (nested ones are indented): their cumulative microseconds.
        top = re.findall(r"^import time:\s+\d+ \|\s+(\d+) \| (\S.*)$", err, re.M)
        imports.append(sum(int(us) for us, _ in top) / 1e6)
    return {"wall": {k: statistics.median(v) for k, v in walls.items()},
            "imports": statistics.median(imports), "reps": reps}


def measure(reps: int) -> dict[str, Any]:
    env = worktree_env()
    proto = dict(env, PYTHONPATH=f"{NOHOP}{os.pathsep}{env['PYTHONPATH']}")
    out: dict[str, Any] = {"load": [loadavg()]}
    with resolving_bed(2) as (bed, _, inside):
        dt = inside + dtlaunch_argv("run", "--gloo", "--no-check", "-H", "h1:1,h2:1", "--iface",
                                    "eth0", "--ssh-config", str(bed.ssh_config), PYTHON)
        pairs: dict[str, list[Run]] = {HOP: [], PROTO: []}
        variants = {HOP: env, PROTO: proto}
        for rep in range(-1, reps):  # one warm-up pair, dropped
            order = [HOP, PROTO] if rep % 2 == 0 else [PROTO, HOP]
            got = {name: one([*dt, TINY_JOB], variants[name], name == HOP) for name in order}
            if rep >= 0:
                for name, run in got.items():
                    pairs[name].append(run)
                log(f"  pair {rep + 1}/{reps}: " + ", ".join(
                    f"{n[:8]} {r.wall:.2f}s links at {r.links_at:.2f}s" for n, r in got.items()))
        out["pairs"] = {n: [asdict(r) for r in runs] for n, runs in pairs.items()}
        out["load"].append(loadavg())
        steady = [one([*dt, "-c", CHATTY], env) for _ in range(3)]
        out["steady"] = [asdict(r) for r in steady]
    out["load"].append(loadavg())
    out["starts"] = interpreter_starts(max(reps, 11))
    out["load"].append(loadavg())
    return out


def med(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def report(res: dict[str, Any]) -> str:
    hop, proto = res["pairs"][HOP], res["pairs"][PROTO]
    diffs = [a["wall"] - b["wall"] for a, b in zip(hop, proto)]
    link_diffs = [a["links_at"] - b["links_at"] for a, b in zip(hop, proto)]
    own = [(a["links_at"] - a["fanout_at"]) - (b["links_at"] - b["fanout_at"])
           for a, b in zip(hop, proto)]
    rows = [[name, f"{med(runs, 'wall'):.2f} ({min(r['wall'] for r in runs):.2f}–"
             f"{max(r['wall'] for r in runs):.2f})", f"{med(runs, 'fanout_at'):.2f}",
             f"{med(runs, 'links_at'):.2f}",
             f"{statistics.median(r['links_at'] - r['fanout_at'] for r in runs) * 1000:.0f}",
             f"{med(runs, 'cpu_after_links') * 1000:.0f}",
             f"{med(runs, 'cpu'):.2f}",
             f"{med(runs, 'rss_mib'):.0f} / {med(runs, 'uss_mib'):.0f}"]
            for name, runs in ((HOP, hop), (PROTO, proto))]
    steady = res["steady"]
    per_s = [(r["cpu"] - r["cpu_after_links"]) / r["seen_s"] for r in steady if r["seen_s"] > 0]
    starts = res["starts"]
    wall = starts["wall"]
    bare = wall["python -I -S -c pass"]
    parts = [
        "## The Gloo fan-out's own process (gloo_start): its cost, paired", "",
        *run_header(res["command"], ""), "",
        f"**Launch**, the tiny Horovod job on 2 test-bed hosts, `--gloo --no-check`, "
        f"{len(hop)} pairs (load average {res['load'][0]} → {res['load'][1]}):", "",
        md_table(["variant", "wall s, median (min–max)", "fan-out began, s",
                  "last link began, s", "fan-out → last link, ms", "fan-out CPU ms, links up", "fan-out CPU s, job",
                  "fan-out RSS / USS MiB"], rows), "",
        f"Paired differences (gloo_start − prototype), medians: wall "
        f"{statistics.median(diffs) * 1000:+.0f} ms (pairs {min(diffs) * 1000:+.0f} to "
        f"{max(diffs) * 1000:+.0f}); last link began "
        f"{statistics.median(link_diffs) * 1000:+.0f} ms "
        f"({min(link_diffs) * 1000:+.0f} to {max(link_diffs) * 1000:+.0f}); fan-out's start "
        f"to its last link {statistics.median(own) * 1000:+.0f} ms ({min(own) * 1000:+.0f} to "
        f"{max(own) * 1000:+.0f}).", "",
        f"**During a job** whose 2 ranks print 20 lines/s for 8 s (3 runs): gloo_start's CPU "
        f"{statistics.median(per_s) * 1000:.0f} ms per second of the job (median), RSS "
        f"{med(steady, 'rss_mib'):.0f} MiB, USS {med(steady, 'uss_mib'):.0f} MiB.", "",
        f"**Start** ({starts['reps']} runs each, medians; load average {res['load'][2]} → "
        f"{res['load'][3]}): `python -I -S -c pass` {bare * 1000:.0f} ms, gloo_start.py "
        f"{wall['gloo_start.py'] * 1000:.0f} ms (+{(wall['gloo_start.py'] - bare) * 1000:.0f}), "
        f"lifeline.py {wall['lifeline.py'] * 1000:.0f} ms "
        f"(+{(wall['lifeline.py'] - bare) * 1000:.0f}); `-X importtime`: gloo_start's top-level "
        f"imports {starts['imports'] * 1000:.1f} ms.", "",
        "Method: times from /proc start times (10 ms ticks) relative to dtlaunch's own; the "
        "fan-out is the process whose child is rsh.py (the lifeline's pid, exec'd into "
        "gloo_start; or the prototype's fork), its links its children but the lifeline's "
        "guard. RSS/USS is psutil's, once both links are up; the prototype's is a "
        "copy-on-write fork of dtlaunch, which a fan-out in dtlaunch's own process would not "
        "have at all. The prototype (bench/scripts/nohop/sitecustomize.py) keeps no lifeline: "
        "timing only.", ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> str:
    args = bench_parser(__doc__, reps=6, out="gloo_hop.md").parse_args(argv)
    res = measure(args.reps)
    res["command"] = command_line("gloo_hop.py", argv)
    return publish(args.out, res, lambda png: report(res))


if __name__ == "__main__":
    main()
