"""Elastic mode on the real test bed: real sshd, real Horovod ranks in `hvd.elastic.run`, a
discovery script whose answer follows a schedule (as Horovod's own elastic integration tests
drive theirs), and each epoch's rank, size and host recorded by the workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.elastic import PROBE, discovery, epochs, every_epoch, last_pass, probe_args
from helpers.jobs import assert_no_strays
from helpers.procs import wait_for
from helpers.ptb import PTB_DIR, needs_ptb
from helpers.suite import dtlaunch_argv, recording_thread_imports
from helpers.testbed import TestBed

pytestmark = pytest.mark.testbed
JOB_LIMIT = 300


@pytest.fixture(scope="module")
def ebed(resolving_bed: TestBed) -> TestBed:
    return resolving_bed


def elastic_argv(bed: TestBed, script: Path, *args: str) -> list[str]:
    return dtlaunch_argv("run", "--no-check", "--iface", bed.subnet, "--ssh-config",
                         str(bed.ssh_config), "--host-discovery-script", str(script), *args)


def three_hosts_argv(bed: TestBed, tmp_path: Path, *probe: str) -> list[str]:
    """A job on h1, h2 and h3 that may go on with 2 (the discovery answer never changes);
    `probe`: the probe's own arguments."""
    schedule = [["h1:1", "h2:1", "h3:1"]]
    script, hosts = discovery(tmp_path, schedule[0])
    return elastic_argv(bed, script, "--min-np", "2",
                        *probe_args(tmp_path, hosts, schedule, *probe))


def test_hosts_added_then_removed_keep_training(ebed: TestBed, tmp_path: Path,
                                               horovod: None) -> None:
    schedule = [["h1:1", "h2:1"], ["h1:1", "h2:1"], ["h1:1", "h2:1", "h3:1"],
                ["h1:1", "h2:1", "h3:1"], ["h1:1", "h3:1"]]
    script, hosts = discovery(tmp_path, schedule[0])
    log = tmp_path / "thread_imports.txt"
    result = subprocess.run(
        elastic_argv(ebed, script, "--min-np", "2", "--max-np", "4",
                     *probe_args(tmp_path, hosts, schedule, "--epochs", "7")),
        capture_output=True, text=True, timeout=JOB_LIMIT,
        env={**os.environ, **recording_thread_imports(log)})
    assert result.returncode == 0, result.stderr
    assert not log.exists(), log.read_text()  # no worker thread imported a module
    found = every_epoch(tmp_path, 7)
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


def test_a_new_host_is_checked_first_and_left_out_when_it_fails(ebed: TestBed, tmp_path: Path,
                                                                horovod: None) -> None:
    """With the pre-flight on, h3 joining with its sshd down is named with its problem and
    left out; the job goes on at size 2 and ends well."""
    schedule = [["h1:1", "h2:1"], ["h1:1", "h2:1", "h3:1"]]
    script, hosts = discovery(tmp_path, schedule[0])
    ebed.stop_sshd("h3")
    try:
        result = subprocess.run(
            dtlaunch_argv("run", "--iface", ebed.subnet, "--ssh-config", str(ebed.ssh_config),
                          "--host-discovery-script", str(script), "--min-np", "2",
                          *probe_args(tmp_path, hosts, schedule, "--epochs", "5")),
            capture_output=True, text=True, timeout=JOB_LIMIT)
    finally:
        ebed.start_sshd("h3")
    assert result.returncode == 0, result.stderr
    left_out = [line for line in result.stderr.splitlines() if "host h3 left out" in line]
    assert len(left_out) == 1 and "ssh" in left_out[0].lower(), result.stderr
    found = every_epoch(tmp_path, 5)
    assert all(int(last_pass(found[e])[0]["size"]) == 2 for e in range(5))  # type: ignore[call-overload]
    assert_no_strays(ebed)


def test_a_failed_rank_blacklists_its_host_and_the_others_go_on(ebed: TestBed, tmp_path: Path,
                                                               horovod: None) -> None:
    result = subprocess.run(three_hosts_argv(ebed, tmp_path, "--epochs", "5", "--fail-at", "2:1"),
                            capture_output=True, text=True, timeout=JOB_LIMIT)
    assert result.returncode == 0, result.stderr
    found = every_epoch(tmp_path, 5)
    assert {r["host"] for r in last_pass(found[4])} == {"h1", "h3"}
    assert "host h2 blacklisted" in result.stderr, result.stderr
    assert_no_strays(ebed)


def test_a_lost_host_is_detected_and_the_survivors_resume(ebed: TestBed, tmp_path: Path,
                                                         horovod: None) -> None:
    proc = subprocess.Popen(three_hosts_argv(ebed, tmp_path, "--epochs", "6"),
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
    found = every_epoch(tmp_path, 6)
    assert {r["host"] for r in last_pass(found[5])} == {"h1", "h3"}
    assert time.monotonic() - lost_at < JOB_LIMIT
    assert_no_strays(ebed)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_stopping_or_killing_dtlaunch_ends_every_worker(ebed: TestBed, tmp_path: Path,
                                                        how: int, horovod: None) -> None:
    proc = subprocess.Popen(three_hosts_argv(ebed, tmp_path, "--epochs", "1000"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: 1 in epochs(tmp_path), "epoch 1 was never reached", 120)
        proc.send_signal(how)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if how == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM, err
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


def ptb_metrics(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def last_step(path: Path) -> int:
    steps = [int(r["step"]) for r in ptb_metrics(path) if r.get("event") == "progress"]  # type: ignore[call-overload]
    return max(steps, default=0)


@needs_ptb
def test_ptb_elastic_grows_and_shrinks_to_the_fixed_runs_perplexity(
        ebed: TestBed, tmp_path: Path, horovod: None) -> None:
    """The bundled model under --elastic: a host joins at about step 40 and another leaves at
    about step 110; its final training perplexity is the fixed 2-rank run's, within noise."""
    common = ["-m", "dtlaunch.examples.ptb_lm", "--config", "small", "--data-path",
              str(PTB_DIR), "--max-steps", "180", "--log-interval", "20", "--no-eval",
              "--threads", "1"]
    fixed = tmp_path / "fixed.jsonl"
    result = subprocess.run(dtlaunch_argv(
        "run", "--gloo", "--no-check", "--iface", ebed.subnet, "--ssh-config",
        str(ebed.ssh_config), "-H", "h1:1,h2:1", *common, "--metrics", str(fixed)),
        capture_output=True, text=True, timeout=JOB_LIMIT)
    assert result.returncode == 0, result.stderr
    script, hosts = discovery(tmp_path, ["h1:1", "h2:1"])
    moving = tmp_path / "elastic.jsonl"
    proc = subprocess.Popen(elastic_argv(ebed, script, "--min-np", "2", *common, "--elastic",
                                         "--commit-every", "10", "--metrics", str(moving)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: last_step(moving) >= 40, "step 40 was never reached", 240)
        hosts.write_text("h1:1\nh2:1\nh3:1\n")
        wait_for(lambda: any(r.get("event") == "elastic_reset" and r.get("ranks") == 3
                             for r in ptb_metrics(moving)), "the job never grew to 3", 120)
        wait_for(lambda: last_step(moving) >= 110, "step 110 was never reached", 240)
        hosts.write_text("h1:1\nh3:1\n")
        out, err = proc.communicate(timeout=JOB_LIMIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    resets = [r["ranks"] for r in ptb_metrics(moving) if r.get("event") == "elastic_reset"]
    assert resets[:1] == [3] and resets[-1] == 2, resets
    final_fixed = next(r for r in ptb_metrics(fixed) if r.get("event") == "final")
    final_moving = next(r for r in ptb_metrics(moving) if r.get("event") == "final")
    assert final_moving["steps"] == final_fixed["steps"] == 180
    ppl_fixed, ppl_moving = float(final_fixed["train_ppl"]), float(final_moving["train_ppl"])  # type: ignore[arg-type]
    assert abs(ppl_moving - ppl_fixed) / ppl_fixed < 0.005, (ppl_fixed, ppl_moving)
    assert "removed from elastic job" not in out + err and "job failed" not in err
    assert_no_strays(ebed)
