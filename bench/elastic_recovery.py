"""Elastic jobs: how fast a new host trains and how fast the survivors go on after a host is
lost, `dtlaunch run --host-discovery-script` against `horovodrun --host-discovery-script` in
the same run; and one rendezvous round at many hosts.

- **join**: 2 hosts train (a step = one allreduce and a commit every 0.2 s); the discovery
  file then lists a third: the time until a step runs at size 3 (goal <= 10 s).
- **lost**: 3 hosts train; every process of h3's network namespace is SIGKILLed (sshd, agent,
  worker), as a machine dying: the time until the launcher says the host is lost (dtlaunch:
  its `host h3 lost` line; goal <= 20 s) and until a step runs at size 2 (goal: <= 5 s after
  detection).
- **rendezvous**: one elastic job of N hosts x 1 slot that takes a few steps and stops: its
  time, and whether any rendezvous timed out.

Everything runs from inside host h1 (its network, hostname and /etc/hosts) on the test bed.

    python bench/elastic_recovery.py [--reps 3] [--hosts 32]
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from common import (
    PYTHON,
    bench_parser,
    dtlaunch_argv,
    horovodrun_env,
    horovodrun_path,
    loadavg,
    md_table,
    publish,
    resolving_bed,
    worktree_env,
)

HERE = Path(__file__).resolve().parent
STEPS = str(HERE / "scripts" / "elastic_steps.py")
LIMIT = 240.0


class Job:
    """A launcher running an elastic job; its stderr lines kept with their arrival times."""

    def __init__(self, argv: list[str], env: dict[str, str], out: Path) -> None:
        self.out = out
        self.lines: list[tuple[float, str]] = []
        self.proc = subprocess.Popen(argv, env=env, cwd="/tmp", stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append((time.time(), line.rstrip("\n")))

    def steps(self) -> list[dict[str, Any]]:
        path = self.out / "steps.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def wait_for(self, test: Any, what: str, limit: float = LIMIT) -> float:
        end = time.time() + limit
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the job ended ({self.proc.returncode}) before {what}: "
                                   + " | ".join(t for _, t in self.lines[-8:]))
            found = test()
            if found:
                return float(found)
            time.sleep(0.05)
        raise RuntimeError(f"no {what} within {limit:g} s: "
                           + " | ".join(t for _, t in self.lines[-8:]))

    def first_step(self, size: int, after: float) -> float | None:
        times = [s["t"] for s in self.steps() if s["size"] == size and s["t"] > after]
        return min(times) if times else None

    def stop(self) -> None:
        (self.out / "stop").touch()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def scenario_times(job: Job, scenario: str, first: int, tmp: Path, addr: dict[str, str],
                   bed: Any) -> dict[str, float]:
    """One scenario's times, once the job trains at its first size."""
    job.wait_for(lambda: len([s for s in job.steps() if s["size"] == first]) > 10,
                 "steps at the first size")
    at = time.time()
    if scenario == "join":
        (tmp / "hosts").write_text("h1:1\nh2:1\nh3:1\n")
        (tmp / "hosts.addr").write_text("".join(f"{addr[n]}:1\n" for n in ("h1", "h2", "h3")))
        done = job.wait_for(lambda: job.first_step(3, at), "a step at 3")
        return {"join to training s": done - at}
    for pid in bed.pids_in("h3"):
        subprocess.run(["kill", "-9", str(pid)], check=False)
    done = job.wait_for(lambda: job.first_step(2, at), "a step at 2")
    times = {"lost to steps s": done - at}
    said = [t for t, text in job.lines if t > at and "h3" in text and "lost" in text]
    if said:
        times["detected s"] = said[0] - at
        times["detected to steps s"] = done - said[0]
    return times


def measure(reps: int) -> dict[str, Any]:
    results: dict[str, dict[str, list[float]]] = {}
    with resolving_bed(3) as (bed, wrap, inside):
        env = worktree_env()
        hvd_env = horovodrun_env(env, wrap)
        addr = {h.name: h.address for h in bed.hosts}

        def launchers(script: Path, out: Path, np: int,
                      ) -> dict[str, tuple[list[str], dict[str, str]]]:
            tools = {"dtlaunch": (inside + dtlaunch_argv(
                "run", "--no-check", "--iface", "eth0", "--ssh-config", str(bed.ssh_config),
                "--host-discovery-script", str(script), "--min-np", "2", PYTHON, STEPS,
                str(out)), env)}
            hvdrun = horovodrun_path()
            if hvdrun:
                tools["horovodrun"] = ([
                    *inside, hvdrun, "--gloo", "--host-discovery-script",
                    str(script) + ".addr", "-np", str(np), "--min-np", "2",
                    "--network-interface", "eth0", PYTHON, STEPS, str(out)], hvd_env)
            return tools

        def discovery(tmp: Path, names: list[str]) -> Path:
            script = tmp / "discover.sh"
            (tmp / "hosts").write_text("".join(f"{n}:1\n" for n in names))
            (tmp / "hosts.addr").write_text("".join(f"{addr[n]}:1\n" for n in names))
            script.write_text(f"#!/bin/sh\nexec cat {tmp / 'hosts'}\n")
            Path(str(script) + ".addr").write_text(f"#!/bin/sh\nexec cat {tmp / 'hosts.addr'}\n")
            script.chmod(0o755)
            Path(str(script) + ".addr").chmod(0o755)
            return script

        for rep in range(reps):
            for name in ("dtlaunch", "horovodrun"):
                for scenario in ("join", "lost"):
                    tmp = Path(f"/tmp/dtl-elastic-bench-{os.getpid()}-{rep}-{name}-{scenario}")
                    tmp.mkdir(parents=True, exist_ok=True)
                    os.chmod(tmp, 0o777)
                    first = ["h1", "h2"] if scenario == "join" else ["h1", "h2", "h3"]
                    script = discovery(tmp, first)
                    tools = launchers(script, tmp, len(first))
                    if name not in tools:
                        continue
                    argv, e = tools[name]
                    job = Job(argv, e, tmp)
                    row = results.setdefault(f"{name} {scenario}", {})
                    try:
                        for what, value in scenario_times(job, scenario, len(first), tmp,
                                                          addr, bed).items():
                            row.setdefault(what, []).append(value)
                    except RuntimeError as exc:
                        row.setdefault("failed", []).append(1.0)
                        print(f"{name} {scenario}: {exc}")
                    finally:
                        job.stop()
                        if scenario == "lost":
                            bed.start_sshd("h3")
    return results


def rendezvous(n: int) -> dict[str, Any]:
    """One elastic job of n hosts x 1 slot under each launcher: until every rank stepped."""
    found: dict[str, Any] = {"hosts": n}
    with resolving_bed(n) as (bed, wrap, inside):
        env = worktree_env()
        tools = {"dtlaunch": (["run", "--no-check", "--iface", "eth0", "--ssh-config",
                               str(bed.ssh_config)], env)}
        hvdrun = horovodrun_path()
        if hvdrun:
            tools["horovodrun"] = ([], horovodrun_env(env, wrap))
        for name, (head, e) in tools.items():
            tmp = Path(f"/tmp/dtl-elastic-rdv-{os.getpid()}-{name}")
            tmp.mkdir(parents=True, exist_ok=True)
            os.chmod(tmp, 0o777)
            names = bed.names if name == "dtlaunch" else [h.address for h in bed.hosts]
            (tmp / "hosts").write_text("".join(f"{h}:1\n" for h in names))
            script = tmp / "discover.sh"
            script.write_text(f"#!/bin/sh\nexec cat {tmp / 'hosts'}\n")
            script.chmod(0o755)
            if name == "dtlaunch":
                argv = dtlaunch_argv(*head, "--host-discovery-script", str(script),
                                     "--min-np", str(n), PYTHON, STEPS, str(tmp), "1")
            else:
                argv = [hvdrun or "", "--gloo", "-np", str(n), "--min-np", str(n),
                        "--host-discovery-script", str(script), "--network-interface",
                        "eth0", PYTHON, STEPS, str(tmp), "1"]
            start = time.time()
            job = Job(inside + argv, e, tmp)
            try:
                job.wait_for(lambda: len([s for s in job.steps() if s["size"] == n]) >= n,  # noqa: B023
                             f"a step at {n}", 900)
                trained: float | None = time.time() - start
            except RuntimeError as exc:
                trained = None
                print(f"{name} rendezvous: {exc}")
            finally:
                job.stop()
            timeouts = [t for _, t in job.lines if "timeout" in t.lower()
                        or "Timed out" in t]
            found[name] = {"first step s": trained, "code": job.proc.returncode,
                           "timeouts": len(timeouts)}
    return found


def report(results: dict[str, dict[str, list[float]]], rdv: dict[str, Any] | None,
           load: str) -> str:
    title = ("## Elastic jobs: a host joining, a host lost (3 test-bed hosts)" if results
             else "## Elastic jobs: one rendezvous at many hosts")
    parts = [title, "", f"load average {load}", ""]
    rows = []
    for name, row in results.items():
        for what, values in row.items():
            rows.append([name, what, f"{statistics.median(values):.1f}",
                         f"{min(values):.1f}–{max(values):.1f}", len(values)])
    if rows:
        parts += [md_table(["launcher scenario", "measure", "median s", "min–max", "n"], rows),
                  ""]
    if rdv is not None:
        rows = [[name, "–" if got["first step s"] is None else f"{got['first step s']:.1f}",
                 got["code"], got["timeouts"]]
                for name, got in rdv.items() if isinstance(got, dict)]
        parts += [f"**One rendezvous at {rdv['hosts']} hosts x 1 slot** (every rank's first "
                  "step at full size)", "",
                  md_table(["launcher", "first step at full size s", "exit", "timeout lines"],
                           rows), ""]
    parts += ["Method: each scenario is one elastic job of tiny steps (one allreduce and a "
              "commit every 0.2 s); times are from the change (the discovery file rewritten, "
              "or every process of h3 SIGKILLed) to the first step logged at the new size, "
              "and, for dtlaunch, to its `host h3 lost` line. horovodrun's discovery lists "
              "the hosts' addresses and its ssh adds the bed's config.", ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> str:
    parser = bench_parser(__doc__, reps=3, out="elastic_recovery.md", hosts="0")
    args = parser.parse_args(argv)
    before = loadavg()
    results = measure(args.reps)
    rdv = rendezvous(int(args.hosts)) if args.hosts and int(args.hosts) > 0 else None
    load = f"{before} → {loadavg()}"
    return publish(args.out, {"results": results, "rendezvous": rdv},
                   lambda png: report(results, rdv, load))


if __name__ == "__main__":
    main()
