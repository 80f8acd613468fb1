"""Runs inside an allocation, as plans and dry runs: hosts, -np, launcher, mpirun's argv and env."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from helpers.suite import dtlaunch_argv

from dtlaunch.cluster.allocation import choose_via, detect, plan_allocation
from dtlaunch.core.errors import UsageError
from dtlaunch.job.env import SLURM_LAUNCH_NAMES
from dtlaunch.job.hosts import Host
from dtlaunch.openmpi.family import OPEN_MPI
from dtlaunch.plan.plan import RunRequest, plan_run

SLURM_ENV = {
    "SLURM_JOB_ID": "1234", "SLURM_JOB_NODELIST": "h[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_NTASKS": "4", "SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_STEP_ID": "0",
    "SLURM_JOB_ACCOUNT": "x", "PATH": "/usr/bin", "MY_TOKEN": "secret",
}


def request(**kw: object) -> RunRequest:
    fields: dict[str, object] = {"hosts": (), "python": "/usr/bin/python3", "script": "train.py"}
    return RunRequest(**{**fields, **kw})  # type: ignore[arg-type]


def test_hosts_and_np_come_from_the_allocation() -> None:
    placed = plan_allocation(request(), detect(SLURM_ENV), "auto")
    assert placed.request.hosts == (Host("h1", 2), Host("h2", 2))
    assert placed.request.num_proc == 4
    assert placed.request.via == "slurm"
    assert placed.source == "hosts from Slurm job 1234: h1:2,h2:2; launcher slurm"


def test_np_and_ssh_launcher_given_are_kept() -> None:
    placed = plan_allocation(request(num_proc=3), detect(SLURM_ENV), "ssh")
    assert placed.request.num_proc == 3 and placed.request.via == "ssh"


def test_hosts_given_inside_the_allocation_must_be_allocated() -> None:
    inside = plan_allocation(request(hosts=(Host("h2", 1),)), detect(SLURM_ENV), "auto")
    assert inside.request.hosts == (Host("h2", 1),)
    with pytest.raises(UsageError, match="h3 not in Slurm job 1234"):
        plan_allocation(request(hosts=(Host("h3", 1),)), detect(SLURM_ENV), "auto")


def test_launcher_choice() -> None:
    assert choose_via("auto", None) == "ssh"
    assert choose_via("ssh", detect(SLURM_ENV)) == "ssh"
    with pytest.raises(UsageError, match=r"--launcher slurm: .*salloc or sbatch"):
        choose_via("slurm", None)
    with pytest.raises(UsageError, match="--launcher"):
        choose_via("pbs", None)


def test_slurm_plan_has_no_ssh_and_keeps_only_the_launch_set() -> None:
    placed = plan_allocation(request(rsh_agent="/x/rsh"), detect(SLURM_ENV), "auto")
    plan = plan_run(placed.request, SLURM_ENV, mpi_version=(4, 1, 4), family=OPEN_MPI)
    argv = list(plan.argv)
    assert not any("plm_rsh" in a or a == "/x/rsh" for a in argv)
    assert argv[argv.index("plm") - 1] == "--mca" and "slurm" in argv
    assert argv[argv.index("-H") + 1] == "h1:2,h2:2"
    assert plan.rank_hosts == ("h1", "h1", "h2", "h2")  # by slot, in the allocation's order
    slurm = {k for k in plan.launcher_env if k.startswith("SLURM_")}
    assert slurm <= set(SLURM_LAUNCH_NAMES)
    assert {"SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_CONF"} <= slurm
    assert "MY_TOKEN" not in plan.launcher_env


def test_slurm_daemons_step_overlaps_unless_the_user_says_otherwise() -> None:
    """A restart after a lost node must not wait for the stopped attempt's step, which holds
    its CPUs until slurmctld declares the node down."""
    placed = plan_allocation(request(), detect(SLURM_ENV), "auto")
    plan = plan_run(placed.request, SLURM_ENV, mpi_version=(4, 1, 4), family=OPEN_MPI)
    assert plan.launcher_env["OMPI_MCA_plm_slurm_args"] == "--overlap"
    mine = {**SLURM_ENV, "OMPI_MCA_plm_slurm_args": "--exclusive"}
    assert plan_run(placed.request, mine, family=OPEN_MPI).launcher_env["OMPI_MCA_plm_slurm_args"] == "--exclusive"
    ssh = plan_run(plan_allocation(request(), detect(SLURM_ENV), "ssh").request, SLURM_ENV, family=OPEN_MPI)
    assert "OMPI_MCA_plm_slurm_args" not in ssh.launcher_env


def test_ssh_plan_inside_slurm_keeps_slurm_out() -> None:
    placed = plan_allocation(request(), detect(SLURM_ENV), "ssh")
    plan = plan_run(placed.request, SLURM_ENV, family=OPEN_MPI)
    assert any(a == "plm_rsh_agent" for a in plan.argv)
    assert not [k for k in plan.launcher_env if k.startswith("SLURM_")]


def dtl(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "train.py").write_text("print('hi')\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run(dtlaunch_argv(*args), capture_output=True, text=True, cwd=tmp_path,
                          env={**base, **env}, timeout=60)


def test_dry_run_inside_slurm_says_where_hosts_came_from(tmp_path: Path) -> None:
    env = {k: v for k, v in SLURM_ENV.items() if k != "PATH"}
    result = dtl(tmp_path, env, "run", "--dry-run", "train.py")
    assert result.returncode == 0, result.stderr
    assert "hosts from Slurm job 1234: h1:2,h2:2; launcher slurm" in result.stderr
    argv = shlex.split(result.stdout)
    assert argv[argv.index("-np") + 1] == "4" and "plm_rsh_agent" not in argv


@pytest.mark.parametrize(("env", "args", "message"), [
    ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "h[1-"}, (), "SLURM_JOB_NODELIST: malformed"),
    ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "h1", "SLURM_TASKS_PER_NODE": "2(x"}, (),
     "SLURM_TASKS_PER_NODE: malformed"),
    ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "h1"}, ("-H", "h9"), "h9 not in Slurm job 1"),
    ({}, ("--launcher", "slurm"), "--launcher slurm: this runs outside any Slurm job"),
])
def test_bad_cluster_input_exits_2(tmp_path: Path, env: dict[str, str], args: tuple[str, ...],
                                   message: str) -> None:
    result = dtl(tmp_path, env, "run", "--dry-run", *args, "train.py")
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_doctor_outside_allocation_refuses_launcher_slurm(tmp_path: Path) -> None:
    result = dtl(tmp_path, {}, "doctor", "--launcher", "slurm")
    assert result.returncode == 2 and "--launcher slurm" in result.stderr


def test_pbs_nodefile_gives_hosts_over_ssh(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodes"
    nodefile.write_text("n1\nn1\nn2\nn2\n")
    result = dtl(tmp_path, {"PBS_NODEFILE": str(nodefile), "PBS_JOBID": "77.server"},
                 "run", "--dry-run", "train.py")
    assert result.returncode == 0, result.stderr
    assert "hosts from PBS job 77.server: n1:2,n2:2; launcher ssh" in result.stderr
    argv = shlex.split(result.stdout)
    assert argv[argv.index("-H") + 1] == "n1:2,n2:2" and "plm_rsh_agent" in argv
