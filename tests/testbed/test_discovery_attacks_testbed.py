"""Hostile or careless discovery scripts against an elastic job on the real test bed: one that
hangs while dtlaunch is stopped (SIGTERM, SIGINT, SIGKILL) at the start or mid-job."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.jobs import assert_no_strays
from helpers.procs import alive, wait_for
from helpers.suite import dtlaunch_argv
from helpers.testbed import TestBed

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="module")
def ebed(resolving_bed: TestBed) -> TestBed:
    return resolving_bed


def hanging_discovery(tmp_path: Path, answers_first: bool) -> Path:
    """A script that hangs (its `sleep 777` writes its pid first); with `answers_first`, only
    from its second call on, the first answering h1:1."""
    script = tmp_path / "discover.sh"
    first = (f'if [ ! -e {tmp_path}/answered ]; then touch {tmp_path}/answered; echo h1:1; '
             "exit 0; fi\n") if answers_first else ""
    script.write_text(f"#!/bin/sh\n{first}echo $$ > {tmp_path}/sleep.pid\nexec sleep 777\n")
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("phase", ["start", "mid-job"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_hanging_discovery_script_ends_with_dtlaunch(
        ebed: TestBed, tmp_path: Path, phase: str, sig: signal.Signals) -> None:
    script = hanging_discovery(tmp_path, answers_first=phase == "mid-job")
    argv = dtlaunch_argv("run", "--no-check", "--iface", ebed.subnet, "--ssh-config",
                         str(ebed.ssh_config), "--host-discovery-script", str(script),
                         "--min-np", "1", sys.executable, "-c", "import time; time.sleep(600)")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    pid_file = tmp_path / "sleep.pid"
    try:
        wait_for(lambda: (pid_file.exists() and pid_file.read_text().strip())
                 or proc.poll() is not None, "the discovery script to hang")
        assert proc.poll() is None, proc.communicate()
        sleeper = int(pid_file.read_text())
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "Traceback" not in err
    # Before: `sleep 777` reparented to PID 1, alive a minute later.
    wait_for(lambda: not alive(sleeper), f"the discovery script ({sleeper}) to end", within=15)
    assert_no_strays(ebed)


def test_an_unknown_host_at_the_start_is_left_out_as_it_is_mid_job(
        ebed: TestBed, tmp_path: Path, horovod: None) -> None:
    """Discovery lists a host nobody can reach beside two good ones, --min-np 2: the job runs
    on the two, and the third is named with its reason (before: the whole job refused)."""
    hosts = tmp_path / "hosts"
    hosts.write_text("h1:1\nnosuch.invalid:1\nh2:1\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\nexec cat {hosts}\n")
    script.chmod(0o755)
    program = tmp_path / "done.py"
    program.write_text("import os, socket\n"
                       "open(os.path.join(os.path.dirname(__file__), 'ran.' + socket.gethostname()),"
                       " 'w').close()\n")
    argv = dtlaunch_argv("run", "--iface", ebed.subnet, "--ssh-config", str(ebed.ssh_config),
                         "--host-discovery-script", str(script), "--min-np", "2",
                         "--max-np", "3", "--timeout", "200", sys.executable, str(program))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "elastic: host nosuch.invalid left out: " in done.stderr, done.stderr
    assert "resolve" in done.stderr.split("nosuch.invalid left out: ")[1].splitlines()[0]
    assert sorted(p.name for p in tmp_path.glob("ran.*")) == ["ran.h1", "ran.h2"]
    assert_no_strays(ebed)
