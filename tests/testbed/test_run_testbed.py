"""dtlaunch run on the real multi-host test bed: real sshd, real mpirun, real ranks."""

from __future__ import annotations

import ipaddress
import os
import subprocess
from pathlib import Path

import pytest
from helpers.jobs import assert_no_strays, records
from helpers.suite import SCRIPTS, dtlaunch_argv
from helpers.testbed import TestBed

pytestmark = pytest.mark.testbed
PROBE = str(SCRIPTS / "rank_probe.py")


def run_on(bed: TestBed, hosts: str, *args: str, iface: str | None = None,
           inside: str | None = None, timeout: float = 120,
           extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    argv = dtlaunch_argv("run", "--no-check", "-H", hosts, "--iface", iface or bed.subnet,
                         "--ssh-config", str(bed.ssh_config), *extra, *args)
    if inside is not None:
        argv = bed.nsenter_argv(inside, argv)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


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


def test_rank_killed_by_signal_is_named(bed: TestBed, tmp_path: Path) -> None:
    result = run_on(bed, "h1:1,h2:1,h3:1", PROBE, "--out", str(tmp_path), "--horovod",
                    "--kill-rank", "2", "--sleep", "600")  # the others outlive run_on's bound
    assert result.returncode != 0
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


def test_timeout_stops_the_job(bed: TestBed, tmp_path: Path) -> None:
    result = run_on(bed, "h1:1,h2:1", PROBE, "--out", str(tmp_path), "--sleep", "600",
                    extra=("--timeout", "3"))  # run_on's own bound catches a hang
    assert result.returncode == 124
    assert "--timeout 3 s" in result.stderr
    assert_no_strays(bed)


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
    # One connect attempt of 15 s fits in the 29 s bound with room for a loaded start-up; a
    # retry (horovodrun tries 5 times) cannot.
    for hosts, bad in (("h1:1,h2:1", "h2"), ("h1:1,ghost:1", "ghost")):
        result = subprocess.run(
            dtlaunch_argv("run", "-H", hosts, "--iface", testbed.subnet, "--connect-timeout", "15",
                          "--ssh-config", str(config), PROBE, "--out", str(tmp_path)),
            capture_output=True, text=True, timeout=29, env=env)
        assert result.returncode == 1, result.stderr
        assert f"pre-flight checks failed: {bad} (ssh)" in result.stderr
        assert "Traceback" not in result.stderr
        assert not list(tmp_path.glob("rank.*.json"))  # nothing was launched
