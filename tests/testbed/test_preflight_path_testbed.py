"""The pre-flight checks the interpreter the ranks run: `dtlaunch run ... python train.py`
with a venv first on the PATH dtlaunch runs with (as an activated venv puts it) finds that
venv's `python` on every host, as the ranks do through the PATH the job exports, and not the
`python` of the hosts' login shells. On the real test bed: sshd, login shells, mpirun."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.suite import dtlaunch_argv
from helpers.testbed import TestBed

pytestmark = pytest.mark.testbed


def venv_bin(tmp_path: Path) -> Path:
    """A venv's bin/ whose `python` is this interpreter, on the filesystem every test-bed host
    shares, and on no host's login PATH."""
    folder = tmp_path / "venv" / "bin"
    folder.mkdir(parents=True)
    wrapper = folder / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    wrapper.chmod(0o755)
    return folder


def test_a_bare_python_is_the_one_the_job_exports(bed: TestBed, tmp_path: Path) -> None:
    folder = venv_bin(tmp_path)
    env = {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}",
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    # The premise: a host's login shell finds another python, or none.
    login = subprocess.run(bed.ssh_argv("h2", "command -v python || true"), capture_output=True,
                           text=True, timeout=60)
    assert str(folder) not in login.stdout
    script = tmp_path / "which.py"
    script.write_text("import socket, sys\nprint('ran', socket.gethostname(), sys.executable)\n")
    hosts = ("-H", "h1:1,h2:1", "--iface", bed.subnet, "--ssh-config", str(bed.ssh_config))
    run = subprocess.run(dtlaunch_argv("run", *hosts, "python", str(script)), env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    for host in ("h1", "h2"):
        assert f"ran {host} {sys.executable}" in run.stdout, run.stdout
    doctor = subprocess.run(dtlaunch_argv("doctor", "--json", *hosts, "--python", "python"),
                            env=env, capture_output=True, text=True, timeout=300)
    report = json.loads(doctor.stdout)
    for entry in report["hosts"]:
        python = next(c for c in entry["checks"] if c["name"] == "python")
        assert python["status"] == "pass" and python["detail"].endswith(sys.executable), entry
    assert doctor.returncode == 0, doctor.stdout


def test_the_commands_executable_is_the_one_the_job_exports(bed: TestBed, tmp_path: Path) -> None:
    folder = venv_bin(tmp_path)
    tool = folder / "hostreport"  # on the job's PATH only
    tool.write_text("#!/bin/sh\necho reported \"$(hostname)\" \"$@\"\n")
    tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}",
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    hosts = ("-H", "h1:1,h2:1", "--iface", bed.subnet, "--ssh-config", str(bed.ssh_config))
    run = subprocess.run(dtlaunch_argv("run", *hosts, "hostreport", "-p", "1"), env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "reported h1 -p 1" in run.stdout and "reported h2 -p 1" in run.stdout
    # One the hosts do not have is found by the pre-flight, before anything starts.
    missing = subprocess.run(dtlaunch_argv("run", *hosts, "no-such-tool-xyz"), env=env,
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode == 1, missing.stderr
    assert "no-such-tool-xyz: not found on the PATH the job exports" in missing.stderr
    assert "(script)" in missing.stderr
