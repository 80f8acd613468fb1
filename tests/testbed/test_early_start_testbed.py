"""A job typed again starts early (run.early_start), on the real test bed: real sshd, mpirun
and ranks, the pre-flight's cache, and a stale memo that must never run."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.jobs import assert_no_strays
from helpers.suite import dtlaunch_argv
from helpers.testbed import TestBed

pytestmark = pytest.mark.testbed
EARLY = "started early"


def _run(bed: TestBed, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    argv = dtlaunch_argv("run", "-v", "-H", "h1:1,h2:1", "--iface", bed.subnet,
                         "--ssh-config", str(bed.ssh_config), *extra, "/bin/hostname")
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def _hosts_said(result: subprocess.CompletedProcess[str]) -> set[str]:
    return {line.split("] ", 1)[1] for line in result.stdout.splitlines() if "] " in line}


def test_the_third_run_starts_early_and_runs_the_same_job(
        make_bed: Callable[..., TestBed], tmp_path: Path) -> None:
    bed = make_bed(2)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    cold = _run(bed, env)  # the full pre-flight
    assert cold.returncode == 0, cold.stderr
    assert "pre-flight: passed recently" not in cold.stderr and EARLY not in cold.stderr
    warm = _run(bed, env)  # a cache hit: the launch is remembered
    assert warm.returncode == 0, warm.stderr
    assert "pre-flight: passed recently (cached)" in warm.stderr and EARLY not in warm.stderr
    assert list((tmp_path / "cache" / "dtlaunch").glob("early-*.json"))
    early = _run(bed, env)
    assert early.returncode == 0, early.stderr
    assert EARLY in early.stderr
    assert _hosts_said(early) == _hosts_said(cold) == {"h1", "h2"}
    # Without the pre-flight it is its own command line: remembered once, then early.
    assert EARLY not in _run(bed, env, "--no-check").stderr
    assert EARLY in _run(bed, env, "--no-check").stderr
    assert_no_strays(bed)


def test_a_stale_memo_is_stopped_before_it_does_anything(
        make_bed: Callable[..., TestBed], tmp_path: Path) -> None:
    """A memo whose launcher is not the plan's (an input the key did not cover): the early
    launcher is killed at once and the planned job runs; the stale one's side effect never
    happens and nothing of it is left."""
    bed = make_bed(2)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    first = _run(bed, env, "--no-check")
    assert first.returncode == 0, first.stderr
    (memo_file,) = (tmp_path / "cache" / "dtlaunch").glob("early-*.json")
    marker = tmp_path / "stale-ran"
    memo = json.loads(memo_file.read_text())
    memo["argv"] = ["/bin/sh", "-c", f'sleep 2; echo stale > "{marker}"']
    memo_file.write_text(json.dumps(memo))
    again = _run(bed, env, "--no-check")
    assert again.returncode == 0, again.stderr
    assert EARLY not in again.stderr
    assert _hosts_said(again) == {"h1", "h2"}
    time.sleep(3)
    assert not marker.exists()
    assert_no_strays(bed)
