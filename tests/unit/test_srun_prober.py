"""SrunProber's handling of srun itself: a step that never answers is named and ended, a
failed step is named with srun's reason. srun here is a small stand-in script; the real
srun path is covered by tests/testbed/test_slurm_run_testbed.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

from helpers.procs import HANG

from dtlaunch.probe.command import ProbeArgs
from dtlaunch.probe.srun_prober import SrunProber


def fake_srun(tmp_path: Path, body: str) -> str:
    path = tmp_path / "srun"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_node_that_never_answers_is_named_and_its_step_ended(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    prober = SrunProber(fake_srun(tmp_path, f"echo $$ > {pidfile}; exec sleep 600"))
    prober.connect_timeout = 0.5
    start = time.monotonic()
    outcome = prober.probe("n7", ProbeArgs(python="python3"), timeout=0.5)
    assert time.monotonic() - start < HANG  # it did not wait for the node
    assert outcome.facts is None and outcome.problem is not None
    assert outcome.problem.detail == "no answer through srun within 1 s"
    assert "n7" in outcome.problem.hint and outcome.path == "srun"
    pid = int(pidfile.read_text())
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_failed_step_is_named_with_sruns_reason(tmp_path: Path) -> None:
    prober = SrunProber(fake_srun(
        tmp_path, "echo 'srun: error: n3: task 0: Exited with exit code 127' >&2; exit 127"))
    outcome = prober.probe("n3", ProbeArgs(python="python3"), timeout=5)
    assert outcome.problem is not None
    assert outcome.problem.detail == "the probe did not run through srun: Exited with exit code 127"
    assert outcome.problem.hint == "try 'srun -w n3 -N1 sh -c true' inside this allocation"


def test_missing_srun_is_named(tmp_path: Path) -> None:
    outcome = SrunProber(os.fspath(tmp_path / "no-srun")).probe("n1", ProbeArgs("python3"), 5)
    assert outcome.problem is not None and "cannot run srun" in outcome.problem.detail
