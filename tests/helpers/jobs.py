"""What a job on the test bed left: the ranks' records and the processes still running."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
from pathlib import Path
from typing import Any

from helpers.procs import HANG, alive, cmdline, descendants, survivors, wait_for
from helpers.testbed import TestBed


def records(out: Path) -> dict[int, dict]:
    """The complete JSON records rank_probe.py wrote, by rank (one being written is left out)."""
    found = {}
    for path in out.glob("rank.*.json"):
        with contextlib.suppress(ValueError):
            found[int(path.name.split(".")[1])] = json.loads(path.read_text())
    return found


def describe(pid: int) -> str:
    """What a stray runs, so a failure names it (it may be gone by the time it is read)."""
    raw = cmdline(pid)
    if not raw:
        return "(gone)"
    return " ".join(raw.decode(errors="replace").split("\0")).strip()[:300] or "(no command line)"


def assert_no_strays(bed: TestBed, within: float = HANG, pids: tuple[int, ...] = ()) -> None:
    """Nothing of a job (mpirun, daemons, ssh, the ranks `pids`) still runs on any host once it
    had `within` seconds to end."""
    def strays() -> dict[str, list[int]]:
        found = {h.name: bed.stray_pids(h) for h in bed.hosts}
        found["ranks"] = [p for p in pids if alive(p)]
        return {where: ps for where, ps in found.items() if ps}

    survivors(lambda: list(strays()), within)
    left = strays()
    if left:
        named = {where: [f"{p} {describe(p)}" for p in ps] for where, ps in left.items()}
        raise AssertionError(f"processes left on test hosts: {named}")


def start_job(argv: list[str], out: Path, ranks: int, env: dict[str, str] | None = None,
              **popen: Any) -> subprocess.Popen[str]:
    """Start a job of rank_probe.py ranks (writing their records into `out`) and return once
    `ranks` of them run; a job that ends first or never gets there fails the test."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **popen)
    try:
        wait_for(lambda: len(records(out)) >= ranks or proc.poll() is not None,
                 f"{ranks} rank(s) to start")
        assert proc.poll() is None, f"the job ended early: {proc.communicate()}"
    except AssertionError:
        proc.kill()
        proc.communicate()
        raise
    return proc


def assert_stopped_by(proc: subprocess.Popen[str], how: signal.Signals) -> None:
    """Send `how` to a running job: dtlaunch must end with status 128 + `how` and say so."""
    proc.send_signal(how)
    _, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 128 + how, err
    assert f"stopped by {how.name}" in err


def assert_sigkill_on_h1_leaves_nothing(bed: TestBed, job_argv: list[str], out: Path) -> None:
    """Start a job of 2 ranks on h1 and 1 on h2 with dtlaunch itself on h1 (h1's agent runs
    beside it, without ssh), SIGKILL dtlaunch: every rank, the local ones included, ends."""
    proc = start_job(bed.nsenter_argv("h1", job_argv, mounts=True), out, 3)
    found = records(out).values()
    assert sorted(r["host"] for r in found) == ["h1", "h1", "h2"]
    # h1's ranks run below dtlaunch itself (its fan-out and local agent), not below an sshd.
    assert {r["pid"] for r in found if r["host"] == "h1"} <= set(descendants(proc.pid))
    proc.kill()
    proc.communicate(timeout=HANG)
    assert_no_strays(bed, pids=tuple(r["pid"] for r in found))
