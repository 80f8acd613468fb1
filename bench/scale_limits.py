"""What breaks first as hosts grow. Three probes on the test bed:

1. sshd's MaxStartups at its default (10:30:100: past 10 logins in progress, sshd drops new
   ones at random): `dtlaunch doctor --pairwise` (what `run --tree-spawn` checks), where every
   host logs in to every other, on a bed whose sshd keep that default; this revision against
   `--baseline REV`, failed pairs counted.
2. File descriptors: `dtlaunch run --no-check` and the hand-written `mpirun` line on the most
   hosts under `ulimit -n 1024` (the usual soft default), the most descriptors any process on
   the launcher's side held.
3. Processes: the most processes on the machine during that launch, against the kernel's
   pid_max and the user's process limit (every host of the bed shares this one kernel).

    python bench/scale_limits.py [--pairwise-hosts 16] [--hosts 64] [--baseline REV]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import threading
from pathlib import Path
from typing import Any

from common import (
    PYTHON,
    SCRIPTS,
    baseline_env,
    baseline_tree,
    bed_of,
    command_line,
    dtlaunch_argv,
    loadavg,
    log,
    md_table,
    run_header,
    timed,
    worktree_env,
    write_result,
)

FD_LIMIT = 1024
JOB = str(SCRIPTS / "print_lines.py")


def failed_pairs(doc: dict[str, Any]) -> tuple[int, list[str]]:
    """(hosts whose pairwise check failed, a few of their details) from doctor's JSON."""
    bad = []
    for host in doc.get("hosts", []):
        for check in host.get("checks", []):
            if check.get("name") == "pairwise" and check.get("status") == "fail":
                bad.append(f"{host.get('host')}: {check.get('detail', '')[:120]}")
    return len(bad), bad[:3]


def pairwise(n: int, reps: int, base: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with bed_of(n, max_startups="10:30:100") as bed:
        cfg = str(bed.ssh_config)  # type: ignore[attr-defined]
        hosts = ",".join(bed.names)  # type: ignore[attr-defined]
        envs = {"this revision": worktree_env()}
        if base is not None:
            envs["baseline"] = baseline_env(base)
        for rep in range(reps):
            for label, env in envs.items():
                sample = timed(dtlaunch_argv("doctor", "-H", hosts, "--ssh-config", cfg,
                                             "--pairwise", "--json", "--timeout", "300"),
                               env=env, check=False, timeout=900)
                try:
                    doc = json.loads(sample.stdout)
                except ValueError:
                    doc = {}
                count, details = failed_pairs(doc)
                out.setdefault(label, []).append({"seconds": sample.seconds, "failed_hosts": count,
                                                  "details": details, "code": sample.returncode})
                log(f"  pairwise {n} hosts, {label}, rep {rep + 1}: {count} host(s) with failed "
                    f"logins, {sample.seconds:.1f} s")
    return out


def startups(counts: list[int]) -> dict[int, Any]:
    """N logins to ONE host at once (what every host of an N+1-host pairwise check got before
    its logins were batched), that host's sshd at the default MaxStartups: failures counted."""
    out: dict[int, Any] = {}
    with bed_of(1, max_startups="10:30:100") as bed:
        cfg = str(bed.ssh_config)  # type: ignore[attr-defined]
        for n in counts:
            script = ('cfg=$1; n=$2; i=0; while [ "$i" -lt "$n" ]; do '
                      '( ssh -F "$cfg" h1 true >/dev/null 2>&1 || echo fail ) & i=$((i + 1)); '
                      'done; wait')
            sample = timed(["sh", "-c", script, "logins", cfg, str(n)], check=False, timeout=600)
            failed = sample.stdout.count("fail")
            out[n] = {"failed": failed, "seconds": sample.seconds}
            log(f"  {n} logins at once to one host (MaxStartups 10:30:100): {failed} failed")
    return out


class Watch:
    """Every 0.1 s: the processes on the machine, and the descriptors each process below
    `root` holds (the largest count per program name)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.most_procs = 0
        self.fds: dict[str, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            parents: dict[int, list[int]] = {}
            names = [p for p in os.listdir("/proc") if p.isdigit()]
            self.most_procs = max(self.most_procs, len(names))
            comm: dict[int, str] = {}
            for name in names:
                try:
                    stat = Path(f"/proc/{name}/stat").read_text()
                except OSError:
                    continue
                head, _, rest = stat.rpartition(")")
                comm[int(name)] = head.split("(", 1)[1] if "(" in head else "?"
                parents.setdefault(int(rest.split()[1]), []).append(int(name))
            todo = [self.root]
            while todo:
                pid = todo.pop()
                try:
                    count = len(os.listdir(f"/proc/{pid}/fd"))
                except OSError:
                    count = 0
                key = comm.get(pid, "?")
                self.fds[key] = max(self.fds.get(key, 0), count)
                todo += parents.get(pid, [])
            self.stop.wait(0.1)


def descriptors(n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with bed_of(n + 1) as bed:
        cfg = str(bed.ssh_config)  # type: ignore[attr-defined]
        spec = ",".join(f"{h}:2" for h in bed.names[1:])  # type: ignore[attr-defined]
        env = worktree_env()
        mpirun = ["mpirun", "--allow-run-as-root", "--tag-output", "-np", str(2 * n), "-H", spec,
                  "--bind-to", "none", "--map-by", "slot", "--mca", "pml", "ob1",
                  "--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_if_include", "eth0",
                  "--mca", "oob_tcp_if_include", "eth0", "--mca", "plm_rsh_args", f"-F {cfg}",
                  "-x", "PATH", PYTHON, JOB, "1"]
        dt = dtlaunch_argv("run", "--no-check", "-H", spec, "--iface", "eth0", "--ssh-config",
                           cfg, JOB, "1")
        for label, argv in (("mpirun (by hand)", mpirun), ("dtlaunch run --no-check", dt)):
            limited = ["prlimit", f"--nofile={FD_LIMIT}:{resource.getrlimit(resource.RLIMIT_NOFILE)[1]}",
                       "--", *bed.nsenter_argv("h1", argv)]  # type: ignore[attr-defined]
            watch = Watch(os.getpid())
            watch.thread.start()
            try:
                sample = timed(limited, env=env, check=False, timeout=600)
            finally:
                watch.stop.set()
                watch.thread.join(5)
            lines = sum(1 for ln in sample.stdout.splitlines() if " line 0 " in ln)
            top = sorted(watch.fds.items(), key=lambda kv: -kv[1])[:4]
            out[label] = {"code": sample.returncode, "seconds": sample.seconds,
                          "lines": f"{lines}/{2 * n}", "fds": top, "procs": watch.most_procs,
                          "error": sample.stderr.strip().splitlines()[-3:] if sample.returncode else []}
            log(f"  {label} on {n} hosts under ulimit -n {FD_LIMIT}: exit {sample.returncode}, "
                f"{lines}/{2 * n} ranks' lines, most fds {top}, most processes {watch.most_procs}")
    return out


def report(res: dict[str, Any], command: str) -> str:
    pid_max = Path("/proc/sys/kernel/pid_max").read_text().strip()
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    parts = ["## What breaks first as hosts grow", "",
             *run_header(command, f"; load average {res['load']} (start → end)."), ""]
    if res.get("pairwise"):
        n = res["pairwise_hosts"]
        rows = []
        for label, runs in res["pairwise"].items():
            for i, r in enumerate(runs, 1):
                rows.append([label, i, f"{r['seconds']:.1f}", r["failed_hosts"],
                             "; ".join(r["details"])[:200] or "–"])
        parts += [f"**1. MaxStartups**: `dtlaunch doctor --pairwise` on {n} hosts whose sshd "
                  f"keep the default `MaxStartups 10:30:100` ({n} × {n - 1} = {n * (n - 1)} "
                  "logins)", "",
                  md_table(["dtlaunch", "run", "wall s", "hosts with failed logins",
                            "what they said"], rows), ""]
    if res.get("startups"):
        rows = [[n, r["failed"], f"{r['seconds']:.1f}"] for n, r in res["startups"].items()]
        parts += ["**1b. MaxStartups, directly**: N logins at once to one host whose sshd keeps "
                  "the default `MaxStartups 10:30:100` (an unbatched pairwise check on N + 1 "
                  "hosts gives every host N at once)", "",
                  md_table(["logins at once", "refused", "wall s"], rows), ""]
    if res.get("fds"):
        rows = []
        for label, r in res["fds"].items():
            rows.append([label, r["code"], f"{r['seconds']:.1f}", r["lines"],
                         ", ".join(f"{k} {v}" for k, v in r["fds"]), r["procs"],
                         " / ".join(r["error"])[:200] or "–"])
        parts += [f"**2 and 3. Descriptors and processes**: a job of {res['fd_hosts']} hosts × 2 "
                  f"ranks (each prints one line) under `ulimit -n {FD_LIMIT}`; the most "
                  "descriptors held by a process on the launcher's side, per program, and the "
                  f"most processes on the machine (pid_max {pid_max}, `ulimit -u` {nproc})", "",
                  md_table(["launcher", "exit", "wall s", "ranks' lines", "most fds per program",
                            "most processes", "error"], rows), ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairwise-hosts", type=int, default=0,
                        help="hosts for the pairwise doctor (N x (N-1) logins: 16 took 160 s here)")
    parser.add_argument("--startups", default="10,32,63",
                        help="numbers of logins at once to one host")
    parser.add_argument("--pairwise-reps", type=int, default=2)
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--baseline", metavar="REV")
    parser.add_argument("--out", default="scale_limits.md")
    args = parser.parse_args(argv)
    res: dict[str, Any] = {"pairwise_hosts": args.pairwise_hosts, "fd_hosts": args.hosts}
    start = loadavg()
    if args.pairwise_hosts:
        with baseline_tree(args.baseline) as base:
            res["pairwise"] = pairwise(args.pairwise_hosts, args.pairwise_reps, base)
    if args.startups:
        res["startups"] = startups([int(n) for n in args.startups.split(",") if n])
    if args.hosts:
        res["fds"] = descriptors(args.hosts)
    res["load"] = f"{start} → {loadavg()}"
    return write_result(args.out, report(res, command_line("scale_limits.py", argv)))


if __name__ == "__main__":
    main()
