"""Elastic mode on the real test bed: real sshd, real Horovod ranks in `hvd.elastic.run`, a
discovery script whose answer follows a schedule (as Horovod's own elastic integration tests
drive theirs), and each epoch's rank, size and host recorded by the workers."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import dtlaunch_argv, require_testbed
from helpers.elastic import PROBE, check_consistent, discovery, epochs, last_pass, probe_args
from helpers.jobs import assert_no_strays
from helpers.procs import wait_for
from helpers.testbed import TestBed, build_testbed

pytestmark = pytest.mark.testbed
JOB_LIMIT = 300


@pytest.fixture(scope="module")
def ebed() -> Iterator[TestBed]:
    require_testbed()
    testbed = build_testbed(3, names_resolve=True)
    try:
        yield testbed
    finally:
        testbed.close()


def elastic_argv(bed: TestBed, script: Path, *args: str) -> list[str]:
    return dtlaunch_argv("run", "--no-check", "--iface", bed.subnet, "--ssh-config",
                         str(bed.ssh_config), "--host-discovery-script", str(script), *args)


def test_hosts_added_then_removed_keep_training(ebed: TestBed, tmp_path: Path,
                                               horovod: None) -> None:
    schedule = [["h1:1", "h2:1"], ["h1:1", "h2:1"], ["h1:1", "h2:1", "h3:1"],
                ["h1:1", "h2:1", "h3:1"], ["h1:1", "h3:1"]]
    script, hosts = discovery(tmp_path, schedule[0])
    result = subprocess.run(
        elastic_argv(ebed, script, "--min-np", "2", "--max-np", "4",
                     *probe_args(tmp_path, hosts, schedule, "--epochs", "7")),
        capture_output=True, text=True, timeout=JOB_LIMIT)
    assert result.returncode == 0, result.stderr
    found = epochs(tmp_path)
    assert sorted(found) == list(range(7))
    check_consistent(found)
    sizes = [int(last_pass(found[e])[0]["size"]) for e in range(7)]  # type: ignore[call-overload]
    # Grew to 3 when h3 appeared, shrank to 2 when h2 left; rank 0 stayed on h1 throughout.
    assert sizes[0] == 2 and 3 in sizes and sizes[-1] == 2, sizes
    assert sizes.index(3) >= 1 and max(i for i, s in enumerate(sizes) if s == 3) < 6, sizes
    final = {r["host"]: r["rank"] for r in last_pass(found[6])}
    assert final == {"h1": 0, "h3": 1}, final
    assert all(r["host"] == "h1" for e in range(7) for r in last_pass(found[e])
               if r["rank"] == 0)
    assert "round 2: 3 rank(s)" in result.stderr and "round 3: 2 rank(s) on h1:1, h3:1" \
        in result.stderr, result.stderr
    # The drained worker on h2 left quietly: no failure, no traceback of its removal.
    assert "removed from elastic job" not in result.stdout + result.stderr
    assert "job failed" not in result.stderr
    assert_no_strays(ebed)


def test_a_failed_rank_blacklists_its_host_and_the_others_go_on(ebed: TestBed, tmp_path: Path,
                                                               horovod: None) -> None:
    schedule = [["h1:1", "h2:1", "h3:1"]]
    script, hosts = discovery(tmp_path, schedule[0])
    result = subprocess.run(
        elastic_argv(ebed, script, "--min-np", "2",
                     *probe_args(tmp_path, hosts, schedule, "--epochs", "5", "--fail-at",
                                 "2:1")),
        capture_output=True, text=True, timeout=JOB_LIMIT)
    assert result.returncode == 0, result.stderr
    found = epochs(tmp_path)
    assert sorted(found) == list(range(5))
    check_consistent(found)
    assert {r["host"] for r in last_pass(found[4])} == {"h1", "h3"}
    assert "host h2 blacklisted" in result.stderr, result.stderr
    assert_no_strays(ebed)


def test_a_lost_host_is_detected_and_the_survivors_resume(ebed: TestBed, tmp_path: Path,
                                                         horovod: None) -> None:
    schedule = [["h1:1", "h2:1", "h3:1"]]
    script, hosts = discovery(tmp_path, schedule[0])
    proc = subprocess.Popen(
        elastic_argv(ebed, script, "--min-np", "2",
                     *probe_args(tmp_path, hosts, schedule, "--epochs", "6")),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: 1 in epochs(tmp_path), "epoch 1 was never reached", 120)
        for pid in ebed.pids_in("h2"):  # the whole host goes: sshd, agent, rank
            subprocess.run(["kill", "-9", str(pid)], check=False)
        lost_at = time.monotonic()
        _out, err = proc.communicate(timeout=JOB_LIMIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        ebed.start_sshd("h2")
    assert proc.returncode == 0, err
    assert "host h2 lost" in err or "host h2 blacklisted" in err, err
    found = epochs(tmp_path)
    assert sorted(found) == list(range(6))
    check_consistent(found)
    assert {r["host"] for r in last_pass(found[5])} == {"h1", "h3"}
    assert time.monotonic() - lost_at < JOB_LIMIT
    assert_no_strays(ebed)


def test_below_min_np_ends_the_job_after_the_elastic_timeout(ebed: TestBed, tmp_path: Path,
                                                             horovod: None) -> None:
    schedule = [["h1:1", "h2:1"], ["h1:1", "h2:1"], ["h1:1"]]
    script, hosts = discovery(tmp_path, schedule[0])
    started = time.monotonic()
    result = subprocess.run(
        elastic_argv(ebed, script, "--min-np", "2", "--elastic-timeout", "8",
                     *probe_args(tmp_path, hosts, schedule, "--epochs", "8")),
        capture_output=True, text=True, timeout=JOB_LIMIT)
    assert result.returncode != 0
    assert "elastic: only 1 slot(s) available (h1:1) after waiting 8 s for 2" in result.stderr, \
        result.stderr
    assert time.monotonic() - started < 120  # not a hang
    assert "Traceback" not in result.stderr
    assert_no_strays(ebed)


def test_the_reset_limit_stops_the_job(ebed: TestBed, tmp_path: Path, horovod: None) -> None:
    schedule = [["h1:1", "h2:1"], ["h1:1", "h2:1", "h3:1"], ["h1:1", "h3:1"]]
    script, hosts = discovery(tmp_path, schedule[0])
    result = subprocess.run(
        elastic_argv(ebed, script, "--min-np", "2", "--reset-limit", "1",
                     *probe_args(tmp_path, hosts, schedule, "--epochs", "8")),
        capture_output=True, text=True, timeout=JOB_LIMIT)
    assert result.returncode == 1, result.stderr
    assert "the job reset 1 time(s), the --reset-limit" in result.stderr, result.stderr
    assert_no_strays(ebed)


@pytest.mark.parametrize("printed, said", [
    ("h1\n", "host h1 has no slots: print HOST:SLOTS, or give --slots-per-host N"),
    ("h1:two\n", "the slots after ':' must be a whole number"),
    ("<html>\n", "line 1 is not a host"),
])
def test_malformed_discovery_is_one_clear_line(ebed: TestBed, tmp_path: Path, printed: str,
                                               said: str) -> None:
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\nprintf '{printed.rstrip()}\\n'\n")
    script.chmod(0o755)
    result = subprocess.run(elastic_argv(ebed, script, "--min-np", "1", PROBE, "--out",
                                         str(tmp_path)),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert said in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
