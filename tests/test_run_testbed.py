"""dtlaunch run on the real multi-host test bed: real sshd, real mpirun, real ranks."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import SCRIPTS, dtlaunch_argv
from testbed import TestBed

pytestmark = pytest.mark.testbed
PROBE = str(SCRIPTS / "rank_probe.py")


def records(out: Path) -> dict[int, dict]:
    return {int(p.name.split(".")[1]): json.loads(p.read_text()) for p in out.glob("rank.*.json")}


def run_on(bed: TestBed, hosts: str, *args: str, iface: str | None = None,
           inside: str | None = None, timeout: float = 120,
           extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    argv = dtlaunch_argv("run", "--no-check", "-H", hosts, "--iface", iface or bed.subnet,
                         "--ssh-config", str(bed.ssh_config), *extra, *args)
    if inside is not None:
        argv = bed.nsenter_argv(inside, argv)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def alive(pid: int) -> bool:
    """A zombie is gone for our purpose: it holds no resources and runs nothing."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def assert_no_strays(bed: TestBed, within: float = 10.0, pids: tuple[int, ...] = ()) -> None:
    deadline = time.monotonic() + within
    while True:
        strays = {h.name: bed.stray_pids(h) for h in bed.hosts}
        strays["ranks"] = [p for p in pids if alive(p)]
        if not any(strays.values()):
            return
        if time.monotonic() > deadline:
            named = {where: [f"{p} {cmdline(p)}" for p in found] for where, found in strays.items()
                     if found}
            raise AssertionError(f"processes left on test hosts: {named}")
        time.sleep(0.2)


def cmdline(pid: int) -> str:
    """What a stray runs, so a failure names it (it may be gone by the time it is read)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "(gone)"
    return " ".join(raw.decode(errors="replace").split("\0")).strip()[:300] or "(no command line)"


def test_ranks_run_on_every_host_with_cidr(bed: TestBed, tmp_path: Path) -> None:
    result = run_on(bed, "h1:2,h2:1,h3:1", PROBE, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    found = records(tmp_path)
    assert sorted(found) == [0, 1, 2, 3]
    assert [found[r]["host"] for r in range(4)] == ["h1", "h1", "h2", "h3"]
    # Output is tagged with rank and host.
    assert "[2@h2] rank 2 of 4 on h2" in result.stdout
    assert_no_strays(bed)


def test_iface_name_from_inside_a_host_with_horovod_allreduce(
    bed: TestBed, tmp_path: Path, horovod: None
) -> None:
    result = run_on(bed, "h1:1,h2:1,h3:1", PROBE, "--out", str(tmp_path), "--horovod",
                    iface="eth0", inside="h1")
    assert result.returncode == 0, result.stderr
    found = records(tmp_path)
    assert {r["host"] for r in found.values()} == {"h1", "h2", "h3"}
    assert all(r["allreduce_sum"] == 6.0 for r in found.values())  # 1 + 2 + 3
    assert found[1]["env"]["NCCL_SOCKET_IFNAME"] == "eth0"
    assert_no_strays(bed)


def test_rank_exit_code_names_rank_and_host(bed: TestBed, tmp_path: Path) -> None:
    result = run_on(bed, "h1:1,h2:1", PROBE, "--out", str(tmp_path),
                    "--exit-rank", "1", "--exit-code", "3", "--sleep", "30")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last == "dtlaunch: job failed: rank 1 on host h2 exited with code 3"
    assert_no_strays(bed)


def test_rank_killed_by_signal_is_named(bed: TestBed, tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_on(bed, "h1:1,h2:1,h3:1", PROBE, "--out", str(tmp_path), "--horovod",
                    "--kill-rank", "2", "--sleep", "60")
    assert result.returncode != 0
    assert time.monotonic() - started < 40
    assert "rank 2 on host h3 was killed by signal 9 (SIGKILL)" in result.stderr.splitlines()[-1]
    assert_no_strays(bed)


HOSTILE_ARGS = [
    "two words",
    "it's \"quoted\"",
    "$(touch {marker})",
    "`touch {marker}`",
    "; touch {marker}",
    "line\nbreak && touch {marker}",
    "*",
    "--not-an-option-of-dtlaunch",
]


def test_script_arguments_arrive_byte_for_byte_and_never_run(bed: TestBed, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    hostile = [a.format(marker=marker) for a in HOSTILE_ARGS]
    out = tmp_path / "out"
    out.mkdir()
    result = run_on(bed, "h1:1,h2:1", PROBE, "--out", str(out), *hostile)
    assert result.returncode == 0, result.stderr
    for rec in records(out).values():
        assert rec["rest"] == hostile
    assert not marker.exists()


def start_sleeping_job(bed: TestBed, hosts: str, out: Path) -> subprocess.Popen[str]:
    """Start a long job with one rank per host and return once every rank is running."""
    argv = dtlaunch_argv("run", "--no-check", "-H", hosts, "--iface", bed.subnet,
                         "--ssh-config", str(bed.ssh_config), PROBE, "--out", str(out),
                         "--sleep", "120")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(records(out)) < len(hosts.split(",")):
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("ranks did not start")
        time.sleep(0.1)
    return proc


def test_sigint_stops_every_rank_on_every_host(bed: TestBed, tmp_path: Path) -> None:
    for sig, expected in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        out = tmp_path / sig.name
        out.mkdir()
        proc = start_sleeping_job(bed, "h1:1,h2:1,h3:1", out)
        proc.send_signal(sig)
        stopped = time.monotonic()
        proc.communicate(timeout=30)
        assert proc.returncode == expected
        assert time.monotonic() - stopped < 10
        assert_no_strays(bed, pids=tuple(r["pid"] for r in records(out).values()))


def test_timeout_stops_the_job(bed: TestBed, tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_on(bed, "h1:1,h2:1", PROBE, "--out", str(tmp_path), "--sleep", "120",
                    extra=("--timeout", "3"))
    assert result.returncode == 124
    assert time.monotonic() - started < 15
    assert "--timeout 3 s" in result.stderr
    assert_no_strays(bed)


def test_host_dying_mid_job_ends_the_job(make_bed, tmp_path: Path) -> None:
    testbed = make_bed(2)
    proc = start_sleeping_job(testbed, "h1:1,h2:1", tmp_path)
    testbed.kill_all_sshd("h2")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert err.splitlines()[-1] == "dtlaunch: job failed: lost the SSH connection to host h2"
    # h1's rank ends with its daemon (the rank shim's death signal), within moments.
    deadline = time.monotonic() + 10
    while testbed.stray_pids("h1") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not testbed.stray_pids("h1")


def test_no_check_with_dead_host_fails_cleanly(make_bed, tmp_path: Path) -> None:
    testbed = make_bed(2)
    testbed.stop_sshd("h2")
    result = run_on(testbed, "h1:1,h2:1", PROBE, "--out", str(tmp_path), timeout=90)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("dtlaunch: job failed:")


def test_preflight_names_a_dead_or_unreachable_host_within_its_timeout(
    make_bed, tmp_path: Path
) -> None:
    testbed = make_bed(2)
    testbed.stop_sshd("h2")
    # An address on the bed's subnet where no host lives: nothing answers at all.
    ghost = str(ipaddress.ip_network(testbed.subnet)[250])
    config = tmp_path / "ssh_config"
    config.write_text(f"Host ghost\n  HostName {ghost}\n" + testbed.ssh_config.read_text())
    env = {**os.environ, "DTLAUNCH_PREFLIGHT_CACHE": "0"}
    for hosts, bad in (("h1:1,h2:1", "h2"), ("h1:1,ghost:1", "ghost")):
        started = time.monotonic()
        result = subprocess.run(
            dtlaunch_argv("run", "-H", hosts, "--iface", testbed.subnet, "--connect-timeout", "3",
                          "--ssh-config", str(config), PROBE, "--out", str(tmp_path)),
            capture_output=True, text=True, timeout=60, env=env)
        elapsed = time.monotonic() - started
        assert result.returncode == 1, result.stderr
        assert elapsed < 3 + 5, elapsed  # the connect timeout plus start-up, no retry loops
        assert f"pre-flight checks failed: {bad} (ssh)" in result.stderr
        assert "Traceback" not in result.stderr
        assert not list(tmp_path.glob("rank.*.json"))  # nothing was launched
