"""A real Slurm cluster on the test bed does what dtlaunch's cluster support relies on.

slurmctld on this machine, one slurmd per bed host (own network, hostname and /tmp), munge:
srun and salloc work, dtlaunch reads salloc's allocation, its srun probe reaches every node and
its parser maps the answers to the right nodes, mpirun starts ranks through Slurm without SSH,
and a batch script built by dtlaunch runs under sbatch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.jobs import records
from helpers.slurm_bed import SlurmCluster
from helpers.suite import SCRIPTS
from helpers.testbed import TestBed

from dtlaunch.cluster.allocation import detect
from dtlaunch.cluster.slurm import build_batch_script, parse_sbatch_output
from dtlaunch.job.env import SLURM_LAUNCH_NAMES
from dtlaunch.job.hosts import Host

pytestmark = pytest.mark.testbed
IN_ALLOCATION = str(SCRIPTS / "in_allocation.py")
PROBE = str(SCRIPTS / "rank_probe.py")


def in_salloc(cluster: SlurmCluster, nodes: int, *args: str, timeout: float = 180) -> dict[str, object]:
    """Run in_allocation.py under `salloc -N nodes` on this machine; its JSON answer."""
    proc = cluster.run("salloc", f"--nodes={nodes}", "--job-name=dtlaunch-test",
                       sys.executable, IN_ALLOCATION, *args, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    answer: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return answer


def test_srun_runs_on_every_node(slurm_cluster: SlurmCluster) -> None:
    proc = slurm_cluster.run("srun", "--nodes=3", "hostname")
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split()) == ["h1", "h2", "h3"]
    slurm_cluster.wait_idle(60)  # the nodes come back from "completing"


def test_salloc_allocation_is_detected(slurm_cluster: SlurmCluster) -> None:
    answer = in_salloc(slurm_cluster, 2, "env")
    env = answer["env"]
    assert isinstance(env, dict)
    alloc = detect(env)
    assert alloc is not None
    assert len(alloc.hosts) == 2 and set(alloc.names) <= {"h1", "h2", "h3"}
    cpus = slurm_cluster.cpus
    assert alloc.hosts == tuple(Host(n, cpus) for n in alloc.names)  # whole nodes: a task per CPU
    assert alloc.total_tasks == 2 * cpus
    assert alloc.describe() == (f"hosts from Slurm job {env['SLURM_JOB_ID']}: "
                                + ",".join(f"{n}:{cpus}" for n in alloc.names))
    assert answer["describe"] == alloc.describe()  # the same inside salloc's own process
    launch_env = answer["launch_env"]
    assert isinstance(launch_env, dict)
    assert set(launch_env) <= set(SLURM_LAUNCH_NAMES)
    assert {"SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
            "SLURM_TASKS_PER_NODE", "SLURM_CONF"} <= set(launch_env)


def test_srun_probe_reaches_every_allocated_node_and_maps_answers(slurm_cluster: SlurmCluster) -> None:
    answer = in_salloc(slurm_cluster, 3, "probe", "h2", "none")
    assert answer["names"] == ["h1", "h2", "h3"]
    assert answer["by_node"] == {n: f"node {n}\nsecond line\n" for n in ("h1", "h2", "h3")}
    assert answer["errors"] == {"h2": "Exited with exit code 3"}
    assert answer["rc"] == 3
    assert answer["unlabeled"] == ""
    assert answer["timed_out"] is False


def test_srun_probe_node_that_never_answers_is_empty_and_cleaned_up(slurm_cluster: SlurmCluster) -> None:
    """At the caller's deadline srun is stopped: the answers so far are kept, the silent node
    maps to "" (so it can be named), and nothing keeps running on it."""
    proc = slurm_cluster.run("salloc", "--nodes=3", "--job-name=dtlaunch-test", sys.executable,
                             IN_ALLOCATION, "probe", "none", "h3", env={**os.environ, "PROBE_TIMEOUT": "8"},
                             timeout=180)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["timed_out"] is True
    assert answer["by_node"] == {"h1": "node h1\nsecond line\n", "h2": "node h2\nsecond line\n", "h3": ""}
    bed = slurm_cluster.bed
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and probe_pids(bed, "h3"):
        time.sleep(0.5)
    assert probe_pids(bed, "h3") == []


def probe_pids(bed: TestBed, host: str) -> list[int]:
    pids = []
    for pid in bed.pids_in(host):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"time.sleep(600)" in cmdline:
            pids.append(pid)
    return pids


def test_srun_probe_with_no_failing_node(slurm_cluster: SlurmCluster) -> None:
    answer = in_salloc(slurm_cluster, 2, "probe", "none", "none")
    names = answer["names"]
    assert isinstance(names, list) and len(names) == 2
    assert answer["by_node"] == {n: f"node {n}\nsecond line\n" for n in names}
    assert answer["errors"] == {} and answer["rc"] == 0


def test_mpirun_starts_ranks_through_slurm_without_ssh(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """Open MPI's plm slurm starts its daemons with srun: ranks on both nodes, none elsewhere.

    Checked through the files every rank writes: under this Slurm, lines printed by ranks of
    mpirun can go missing on stdout (see the Slurm notes in the shared docs).
    """
    answer = in_salloc(slurm_cluster, 2, "mpirun", str(tmp_path), slurm_cluster.bed.subnet,
                       sys.executable, PROBE, "--out", str(tmp_path))
    assert answer.get("hung") is None, answer
    assert answer["rc"] == 0, answer
    names = answer["names"]
    assert isinstance(names, list)
    found = records(tmp_path)
    cpus = slurm_cluster.cpus
    assert sorted(found) == list(range(2 * cpus))
    assert sorted(str(r["host"]) for r in found.values()) == sorted(names * cpus)
    for r in found.values():
        env = r["env"]
        assert isinstance(env, dict)
        assert "SLURM_STEP_ID" in env  # the rank's daemon was started by srun, not ssh
    env_names = answer["env_names"]
    assert isinstance(env_names, list)
    assert {n for n in env_names if n.startswith("SLURM_")} <= set(SLURM_LAUNCH_NAMES)


def test_srun_pmix_runs_a_horovod_allreduce_across_two_nodes(
    slurm_cluster: SlurmCluster, tmp_path: Path, horovod: None
) -> None:
    proc = slurm_cluster.run("salloc", "--nodes=2", "srun", "--mpi=pmix", "--ntasks=4",
                             sys.executable, PROBE, "--out", str(tmp_path), "--horovod", timeout=240)
    assert proc.returncode == 0, proc.stderr
    found = records(tmp_path)
    assert sorted(found) == [0, 1, 2, 3]
    assert {r["allreduce_sum"] for r in found.values()} == {10.0}
    assert len({r["host"] for r in found.values()}) == 2


def test_sbatch_runs_a_batch_script_built_by_dtlaunch(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "job-%j.out"
    script = build_batch_script(
        [("-N", "2"), ("--job-name", "dtlaunch batch test"), ("-o", str(out)), ("-t", "5")],
        ["srun", "--label", sys.executable, "-c",
         "import os, socket; print(socket.gethostname(), os.environ['SLURM_JOB_NAME'])"],
    )
    path = tmp_path / "job.sh"
    path.write_text(script)
    proc = slurm_cluster.run("sbatch", str(path))
    assert proc.returncode == 0, proc.stderr
    job = parse_sbatch_output(proc.stdout)
    assert slurm_cluster.wait_job_ended(job) == "COMPLETED"
    text = (tmp_path / f"job-{job}.out").read_text()
    lines = sorted(text.splitlines())
    assert len(lines) == 2
    assert {line.split()[1] for line in lines} <= {"h1", "h2", "h3"}
    assert all(line.endswith(" dtlaunch batch test") for line in lines)


def test_cluster_stops_cleanly(make_bed: object, tmp_path: Path) -> None:
    """A second, private cluster: stop() leaves no daemon, no node process and no files."""
    from helpers.slurm_bed import start_slurm_cluster

    bed = make_bed(2)  # type: ignore[operator]
    cluster = start_slurm_cluster(bed)
    proc = cluster.run("srun", "--nodes=2", "hostname")
    assert sorted(proc.stdout.split()) == ["h1", "h2"]
    daemons = [cluster.munged, cluster.slurmctld, *cluster.slurmds.values()]
    cluster.stop()
    assert all(p is not None and p.poll() is not None for p in daemons)
    assert all(bed.stray_pids(h) == [] for h in bed.hosts)
    assert not cluster.dir.exists()
    assert subprocess.run(["pgrep", "-f", str(cluster.conf)], capture_output=True).returncode == 1
