"""`dtlaunch run --max-restarts` inside a real Slurm allocation on the test bed (issue 13).

The hosts come from the allocation, the re-check runs through srun and every attempt's ranks
are started by mpirun's plm slurm: restarts stay on the allocated nodes. The tests rely on exit
statuses, the ranks' own files and `--output-dir/attempts.json`, not on wording.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import slurm_bed
from helpers.procs import cmdline, survivors, wait_for
from helpers.slurm_bed import SlurmCluster
from helpers.suite import SCRIPTS, dtlaunch_argv

pytestmark = pytest.mark.testbed
PROBE = str(SCRIPTS / "restart_probe.py")


def attempts(out: Path) -> list[dict[str, Any]]:
    return list(json.loads((out / "logs" / "attempts.json").read_text())["attempts"])


def ranks_of(out: Path, attempt: int) -> dict[int, str]:
    return {int(p.name.split("rank")[1]): p.read_text().split()[0]
            for p in out.glob(f"attempt{attempt}.rank*")}


def job_pids(testbed: Any, hosts: tuple[str, ...], marker: str) -> list[int]:
    """Processes on these nodes whose command line holds `marker` (this test's directory)."""
    return [pid for host in hosts for pid in testbed.pids_in(host) if marker.encode() in cmdline(pid)]


def cluster_sruns(cluster: SlurmCluster) -> list[str]:
    """srun processes on this machine that belong to this cluster, now."""
    left = []
    for p in psutil.process_iter(["name", "environ"]):
        with contextlib.suppress(psutil.Error):
            if p.info["name"] == "srun" and \
                    (p.info["environ"] or {}).get("SLURM_CONF") == str(cluster.conf):
                left.append(" ".join(p.cmdline())[:160])
    return left


def test_a_rank_failing_once_is_restarted_on_the_allocated_nodes(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Rank 1 exits 3 in the first attempt only: the second attempt runs every rank with
    DTLAUNCH_RESTART_COUNT=1 on the same allocated nodes (re-checked through srun), exit 0."""
    nodes = tmp_path / "nodes"
    proc = slurm_cluster.run(
        "salloc", "--nodes=2", "--job-name=dtl-restart-once", "sh", "-c",
        f'echo "$SLURM_JOB_NODELIST" > {nodes} && exec "$@"', "sh", *dtlaunch_argv(
            "run", "-v", "--max-restarts", "2", "--output-dir", str(tmp_path / "logs"),
            "--iface", slurm_cluster.bed.subnet, PROBE, str(tmp_path), "fail-once"),
        timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "launcher slurm" in proc.stderr
    runs = attempts(tmp_path)
    assert [a["exit_code"] for a in runs] == [3, 0]
    allocated = runs[0]["hosts"]
    assert len(allocated) == 2 and runs[1]["hosts"] == allocated
    assert nodes.read_text().strip() in (f"h[{allocated[0][1:]}-{allocated[1][1:]}]",
                                         f"h[{allocated[0][1:]},{allocated[1][1:]}]")
    ranks = runs[1]["ranks"]
    assert ranks == runs[0]["ranks"] and ranks >= 2
    # every rank of attempt 2 saw DTLAUNCH_RESTART_COUNT=1. Once, under load, one rank's file
    # was missing at this check: waited for within a bound, and the run's output is kept in the
    # message should it happen again.
    with contextlib.suppress(AssertionError):
        wait_for(lambda: len(ranks_of(tmp_path, 1)) >= ranks, "every rank's file")
    second = ranks_of(tmp_path, 1)
    assert sorted(second) == list(range(ranks)), (sorted(p.name for p in tmp_path.iterdir()),
                                                  proc.stderr[-3000:])
    assert set(second.values()) <= set(allocated)
    assert socket.gethostname() not in second.values()
    assert sorted(ranks_of(tmp_path, 0)) == list(range(ranks))
    slurm_cluster.wait_idle(60)


def test_scancel_of_the_allocation_is_named_and_never_restarted(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """scancel ends the allocation under a running job: dtlaunch says the Slurm job was
    cancelled, and --max-restarts stops without re-checking (through srun, not ssh) nodes
    that are no longer the job's and without dropping them as lost (issue 27)."""
    name = f"dtl-scancel-{os.getpid()}"
    argv = ["salloc", "--nodes=2", f"--job-name={name}", *dtlaunch_argv(
        "run", "--max-restarts", "2", "--output-dir", str(tmp_path / "logs"),
        "--iface", slurm_cluster.bed.subnet, PROBE, str(tmp_path), "hang-first")]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=slurm_cluster.env(),
                            start_new_session=True)
    try:
        wait_for(lambda: len(ranks_of(tmp_path, 0)) >= 2 or proc.poll() is not None,
                 "the first attempt's ranks")
        assert len(ranks_of(tmp_path, 0)) >= 2, "the first attempt's ranks did not start"
        queue = slurm_cluster.run("squeue", "-h", "-n", name, "-o", "%i", timeout=30).stdout
        job = queue.split()[0]
        assert slurm_cluster.run("scancel", job, timeout=30).returncode == 0
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0
    assert f"the Slurm job {job} was cancelled" in err, err[-3000:]
    assert "lost the connection" not in err and "dropping" not in err, err[-3000:]
    assert "re-checking" not in err and "ssh:" not in err, err[-3000:]
    report = json.loads((tmp_path / "logs" / "attempts.json").read_text())
    assert len(report["attempts"]) == 1 and report["stop"]["kind"] == "allocation", report
    slurm_cluster.wait_idle(120)


def test_a_node_lost_mid_job_is_dropped_and_the_job_finishes_on_the_others(
    make_bed: Any, tmp_path: Path
) -> None:
    """Inside `salloc -N3 --no-kill`, h3's link goes down while every rank sleeps: there is no
    ssh link to watch (plm slurm), yet dtlaunch names the lost node, drops it and finishes on
    the other two well before slurmctld would declare h3 down (SlurmdTimeout)."""
    testbed = make_bed(3)
    logs = tmp_path / "logs"
    with slurm_bed.slurm_cluster(testbed, shared=[tmp_path]) as cluster:
        argv = ["salloc", "--nodes=3", "--no-kill", "--job-name=dtl-lost", *dtlaunch_argv(
            "run", "--max-restarts", "2", "--output-dir", str(logs), "--iface", testbed.subnet,
            PROBE, str(tmp_path), "hang-first")]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=cluster.env(),
                                start_new_session=True)
        try:
            wait_for(lambda: len(ranks_of(tmp_path, 0)) >= 3 * cluster.cpus or proc.poll() is not None,
                     "the first attempt's ranks")
            assert sorted(set(ranks_of(tmp_path, 0).values())) == ["h1", "h2", "h3"]
            testbed.set_link("h3", up=False)
            _, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
        assert proc.returncode == 0, err[-3000:]
        # Not even the stopped attempt's srun, which would wait for the dead node for minutes.
        assert cluster_sruns(cluster) == []
        runs = attempts(tmp_path)
        assert [a["hosts"] for a in runs] == [["h1", "h2", "h3"], ["h1", "h2"]]
        dropped = runs[1]["dropped_before"]
        assert [d["host"] for d in dropped] == ["h3"]
        assert "lost" in dropped[0]["why"], dropped  # the failure named h3, not just a re-check
        assert sorted(set(ranks_of(tmp_path, 1).values())) == ["h1", "h2"]
        # Nothing of the job is left on the healthy nodes (slurmd itself lives there too).
        assert survivors(lambda: job_pids(testbed, ("h1", "h2"), str(tmp_path))) == []
