"""The console of a real job on the test bed (issue 26): `--ranks`, the root-cause report (text
and `--json`) when one host's rank fails and the launcher kills the others, and the progress
line on a terminal (a pty) and its absence elsewhere."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import time
from pathlib import Path

import pytest
from helpers.jobs import assert_no_strays
from helpers.mpi_envs import MpiEnv
from helpers.procs import HANG
from helpers.suite import SCRIPTS, dtlaunch_argv
from helpers.testbed import TestBed

pytestmark = pytest.mark.testbed
PROBE = str(SCRIPTS / "rank_probe.py")
FAIL_AFTER_ALL = str(SCRIPTS / "fail_after_all.py")
HOSTS = "h1:2,h2:2,h3:1"  # ranks 0-1 on h1, 2-3 on h2, 4 on h3
WHERE = ["h1", "h1", "h2", "h2", "h3"]


def argv(bed: TestBed, *args: str) -> list[str]:
    return dtlaunch_argv("run", "-H", HOSTS, "--iface", bed.subnet, "--ssh-config",
                         str(bed.ssh_config), *args)


def test_the_root_cause_comes_first_the_rest_grouped_and_the_filter_hides_the_others(
        bed: TestBed, tmp_path: Path, mpi_env: MpiEnv) -> None:
    """Rank 4 (alone on h3) exits 5; the launcher kills ranks 0-3 on h1 and h2 (mpirun itself,
    or dtlaunch under Hydra). The console shows rank 0 only, yet the report names rank 4 first
    with its last line, the others in one line per cause; --json says the same on stdout;
    every rank's log is whole. With each MPI."""
    logs = tmp_path / "logs"
    # From inside h1, with an interface name, as every MPI takes it (Hydra takes no subnet).
    command = mpi_env.dtlaunch_argv(
        "run", "--no-check", "-H", HOSTS, "--iface", "eth0", "--ssh-config", str(bed.ssh_config),
        "--ranks", "0", "--output-dir", str(logs), "--json", FAIL_AFTER_ALL, str(tmp_path),
        "4", "5")
    result = subprocess.run(bed.nsenter_argv("h1", command), capture_output=True, text=True,
                            timeout=HANG, env=mpi_env.environ())
    assert result.returncode == 5, result.stderr
    report = json.loads(result.stdout)  # stdout is the report's alone: the ranks' went to stderr
    root = report["root_cause"]
    assert (root["rank"], root["host"], root["exit_code"], root["signal"]) == (4, "h3", 5, None)
    assert root["last_lines"] == ["rank 4 of 5 on h3", "rank 4: giving up"]
    others = report["other_failures"]
    assert sorted(r for group in others for r in group["ranks"]) == [0, 1, 2, 3]
    assert len(others) == len({group["cause"] for group in others}) <= 2  # one line per cause
    assert all(group["cause"].endswith("after rank 4 failed") for group in others)
    assert all(set(group["hosts"]) <= {"h1", "h2"} for group in others)

    lines = result.stderr.splitlines()
    first = lines.index("dtlaunch: root cause (first failure): rank 4 on host h3 exited with "
                        f"code 5 at {_clock(root['at'])}")
    assert lines[first + 1:first + 4] == ["dtlaunch:   its last 2 line(s):",
                                          "    [4@h3] rank 4 of 5 on h3",
                                          "    [4@h3] rank 4: giving up"]
    assert lines[first + 4:-1] == [f"dtlaunch: then: {_group_line(g)}" for g in others]
    assert lines[-1] == "dtlaunch: job failed: rank 4 on host h3 exited with code 5"
    assert report["summary"] == lines[-1].removeprefix("dtlaunch: ")

    # --ranks 0: rank 0's line shows; the others' only in the report (rank 4's) and the logs.
    assert "[0@h1] rank 0 of 5 on h1" in lines, result.stderr
    assert not [line for line in lines if line.startswith(("[1@", "[2@", "[3@", "[4@"))]
    for rank, host in enumerate(WHERE):
        mine = f"rank {rank} of 5 on {host}\n" + ("rank 4: giving up\n" if rank == 4 else "")
        assert (logs / f"rank.{rank}.log").read_bytes() == mine.encode()
    assert_no_strays(bed)


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at % 1 * 1000):03d}"


def _group_line(group: dict[str, object]) -> str:
    word = "rank" if len(group["ranks"]) == 1 else "ranks"  # type: ignore[arg-type]
    return f"{word} {group['ranks_text']} on {group['hosts_text']}: {group['cause']}"


def _run_on_a_pty(command: list[str], env: dict[str, str]) -> tuple[int, bytes, bytes]:
    """Run with stderr on a terminal (a pty) and stdout on a pipe; returns the exit status,
    what the terminal got and stdout."""
    leader, follower = os.openpty()
    env = {**env, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=follower,
                            stdin=subprocess.DEVNULL, env=env)
    os.close(follower)
    screen = bytearray()
    deadline = time.monotonic() + HANG
    try:
        while time.monotonic() < deadline:
            ready = select.select([leader], [], [], 0.2)[0]
            if ready:
                try:
                    data = os.read(leader, 65536)
                except OSError:  # EIO: every writer has closed it
                    break
                if not data:
                    break
                screen += data
            elif proc.poll() is not None:
                break
        assert proc.stdout is not None
        out = proc.stdout.read()
        code = proc.wait(timeout=HANG)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    return code, bytes(screen), out


def test_the_progress_line_shows_on_a_terminal_and_nowhere_else(
        bed: TestBed, tmp_path: Path) -> None:
    """The launch stage drawn live on the terminal from its start (`ranks running 0/5`) and
    gone before the ranks' lines; with the pre-flight, its stage first (`hosts checked N/N`);
    on pipes not a byte of it, and no escape code at all."""
    command = argv(bed, "--no-check", PROBE, "--out", str(tmp_path))
    code, screen, out = _run_on_a_pty(command, dict(os.environ))
    text = screen.decode("utf-8", "replace")
    assert code == 0, text
    assert "ranks running 0/5" in text  # drawn at once: a stall would show as this count
    assert "\x1b[" in text  # drawn live, and taken away again
    assert b"rank 0 of 5 on h1" in out
    assert "hosts checked" not in text  # --no-check: no pre-flight stage

    checked = argv(bed, PROBE, "--out", str(tmp_path))
    code, screen, out = _run_on_a_pty(checked, {**os.environ, "DTLAUNCH_PREFLIGHT_CACHE": "0"})
    text = screen.decode("utf-8", "replace")
    assert code == 0, text
    counts = re.findall(r"hosts checked (\d+)/(\d+)", text)
    assert counts and counts[-1][0] == counts[-1][1], text  # every host checked, drawn live
    assert text.index("hosts checked") < text.index("ranks running")  # the stages in order
    assert b"rank 0 of 5 on h1" in out and b"hosts checked" not in out

    plain = subprocess.run(command, capture_output=True, timeout=HANG)
    assert plain.returncode == 0, plain.stderr
    for stream in (plain.stdout, plain.stderr):
        assert b"ranks running" not in stream and b"\x1b" not in stream
    assert_no_strays(bed)


def test_doctor_shows_the_same_line_on_a_terminal(bed: TestBed) -> None:
    command = dtlaunch_argv("doctor", "-H", "h1,h2,h3", "--ssh-config", str(bed.ssh_config))
    code, screen, out = _run_on_a_pty(command, dict(os.environ))
    text = screen.decode("utf-8", "replace")
    assert code == 0, text + out.decode()
    assert "hosts checked 4/4" in text and "\x1b[" in text
    assert b"all 4 host(s) ready" in out and b"hosts checked" not in out
    plain = subprocess.run(command, capture_output=True, timeout=HANG)
    assert plain.returncode == 0 and b"hosts checked" not in plain.stderr + plain.stdout
    assert b"\x1b" not in plain.stderr
