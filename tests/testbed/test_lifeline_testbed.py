"""On the real test bed: a killed dtlaunch leaves nothing running; ssh paths never reach a
remote shell; a lost link is told from a remote exit 255; a missing program is named."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.jobs import assert_no_strays, records
from helpers.procs import alive, cmdline, descendants, pids_containing, ppid, sleeping, survivors, wait_for
from helpers.slurm_bed import SlurmCluster
from helpers.suite import SCRIPTS, dtlaunch_argv
from helpers.testbed import TestBed

from dtlaunch.agents.lifeline import stop_session
from dtlaunch.agents.rsh import LOST_PREFIX, SSH_ARGS_ENV

pytestmark = pytest.mark.testbed
PROBE = str(SCRIPTS / "rank_probe.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGQUIT])
def test_killing_dtlaunch_mid_job_leaves_nothing_on_any_host(
        bed: TestBed, tmp_path: Path, signum: int) -> None:
    # Launched from h1: mpirun, its guard and rank 0 run there, ranks 1 and 2 behind ssh.
    argv = bed.nsenter_argv("h1", dtlaunch_argv(
        "run", "--no-check", "-H", "h1:1,h2:1,h3:1", "--iface", bed.subnet,
        "--ssh-config", str(bed.ssh_config), PROBE, "--out", str(tmp_path), "--sleep", "300"))
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: len(records(tmp_path)) >= 3 or proc.poll() is not None, "the ranks to start")
        assert proc.poll() is None, "dtlaunch ended early"
        assert {r["host"] for r in records(tmp_path).values()} == {"h1", "h2", "h3"}
        proc.send_signal(signum)
        proc.wait(timeout=30)
        assert_no_strays(bed, pids=tuple(r["pid"] for r in records(tmp_path).values()))
    finally:
        proc.kill()
        proc.wait()


def _config_without_identity(bed: TestBed, path: Path) -> Path:
    lines = bed.ssh_config.read_text().splitlines(keepends=True)
    path.write_text("".join(line for line in lines if "IdentityFile" not in line))
    return path


def test_hostile_ssh_paths_work_and_nothing_is_evaluated_remotely(
        bed: TestBed, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    key = keys / "key$(hostname>&2)"
    shutil.copy(bed.client_key, key)
    key.chmod(0o600)
    # The config names no key: only --ssh-identity-file can log in.
    config = _config_without_identity(bed, keys / 'cfg"quoted$(hostname>&2)')
    out = tmp_path / "out"
    out.mkdir()
    result = subprocess.run(
        dtlaunch_argv("run", "--no-check", "-H", "h1:1,h2:1", "--iface", bed.subnet,
                      "--ssh-config", str(config), "--ssh-identity-file", str(key),
                      PROBE, "--out", str(out)),
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert {r["host"] for r in records(out).values()} == {"h1", "h2"}
    evaluated = [line for line in result.stderr.splitlines() if line.strip() in bed.names]
    assert evaluated == [], "a remote shell ran part of a path"
    # With --tree-spawn the options would reach a remote shell: refused in one line.
    refused = subprocess.run(
        dtlaunch_argv("run", "--no-check", "--tree-spawn", "-H", "h1:1,h2:1", "--ssh-config",
                      str(config), "--ssh-identity-file", str(key), PROBE, "--out", str(out)),
        capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "cannot carry safely" in refused.stderr


def test_tree_spawn_with_plain_paths_still_runs(bed: TestBed, tmp_path: Path) -> None:
    result = subprocess.run(
        dtlaunch_argv("run", "--no-check", "--tree-spawn", "-H", "h1:1,h2:1,h3:1", "--iface",
                      bed.subnet, "--ssh-config", str(bed.ssh_config), "--ssh-identity-file",
                      str(bed.client_key), PROBE, "--out", str(tmp_path)),
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert {r["host"] for r in records(tmp_path).values()} == {"h1", "h2", "h3"}


def _rsh(bed: TestBed, *command: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           SSH_ARGS_ENV: json.dumps(["-F", str(bed.ssh_config), "-o", "BatchMode=yes",
                                     "-o", "ServerAliveInterval=1", "-o", "ServerAliveCountMax=2"])}
    return subprocess.Popen([sys.executable, "-m", "dtlaunch.agents.rsh", "h2", *command], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_remote_exit_255_is_not_a_lost_link_but_a_link_down_is(make_bed) -> None:
    testbed = make_bed(2)
    remote = _rsh(testbed, "echo oops >&2; exit 255")
    _, err = remote.communicate(timeout=60)
    assert remote.returncode == 255
    assert err == "oops\n"  # the remote stderr, and nothing about a lost link
    waiting = _rsh(testbed, "sleep 3061")
    wait_for(lambda: sleeping("3061"), "the remote command to run")
    testbed.set_link("h2", up=False)
    try:
        _, err = waiting.communicate(timeout=60)
    finally:
        testbed.set_link("h2", up=True)
    assert waiting.returncode == 255
    assert f"{LOST_PREFIX}h2 (ssh exit status 255)" in err
    assert "not responding" in err  # ssh's own message still reaches the user


def test_a_missing_interpreter_names_host_rank_and_program(bed: TestBed, tmp_path: Path) -> None:
    result = subprocess.run(
        dtlaunch_argv("run", "--no-check", "-H", "h1:1,h2:1", "--iface", bed.subnet,
                      "--ssh-config", str(bed.ssh_config), "/nonexistent/python3", PROBE,
                      "--out", str(tmp_path)),
        capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("dtlaunch: job failed: rank "), result.stderr
    assert "/nonexistent/python3 was not found or is not executable there" in last
    assert " on host h1" in last or " on host h2" in last


def _argv0(pid: int) -> bytes:
    return os.path.basename(cmdline(pid).split(b"\0")[0])


def test_killing_dtlaunch_inside_slurm_leaves_nothing(slurm_cluster: SlurmCluster,
                                                      tmp_path: Path) -> None:
    """--launcher slurm: mpirun's daemons come from srun; SIGKILL of dtlaunch ends them all."""
    marker = str(tmp_path)
    argv = ["salloc", "--nodes=2", "--job-name=dtl-lifeline", *dtlaunch_argv(
        "run", "--no-check", "--iface", slurm_cluster.bed.subnet, "-np", "2", "-H", "h1:1,h2:1",
        PROBE, "--out", marker, "--sleep", "300")]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=slurm_cluster.env(),
                            start_new_session=True)
    try:
        wait_for(lambda: len(records(tmp_path)) >= 2 or proc.poll() is not None, "the ranks to start")
        assert proc.poll() is None, "dtlaunch ended before its ranks started"
        argvs = {p: cmdline(p).split(b"\0") for p in pids_containing(marker)}
        launcher = [p for p, a in argvs.items() if a[1:3] == [b"-m", b"dtlaunch"]]
        assert len(launcher) == 1, argvs
        # mpirun's argv does not hold the marker (the rank shim carries the program encoded):
        # mpirun and its srun are found under dtlaunch, each rank's shim and daemon above it.
        below = descendants(launcher[0])
        mpirun = [p for p in below if _argv0(p) == b"mpirun"]
        assert mpirun, "mpirun not found"
        assert any(_argv0(p) == b"srun" for p in below), "srun not found"
        ranks = [p for p in argvs if p not in below and p != proc.pid and p != launcher[0]]
        shims = [ppid(p) for p in ranks]
        daemons = [ppid(p) for p in shims]
        watched = set(below + shims + daemons)
        os.kill(launcher[0], signal.SIGKILL)
        left = survivors(lambda: pids_containing(marker) + [p for p in watched if alive(p)])
        assert left == [], "mpirun, srun or ranks outlived dtlaunch"
    finally:
        # On a failure: salloc puts dtlaunch in a process group of its own, and a SIGKILLed
        # salloc never releases its nodes (InactiveLimit=0), which would leave the next
        # test's salloc waiting for them. End the whole session and cancel the job.
        stop_session(proc.pid, signal_leader=False, grace=0)
        proc.wait()
        slurm_cluster.run("scancel", "--name=dtl-lifeline", timeout=30)
    slurm_cluster.wait_idle(60)
