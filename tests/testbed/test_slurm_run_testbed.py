"""dtlaunch run and doctor inside a real Slurm allocation on the test bed (no SSH at all).

`salloc -N n dtlaunch ...` on this machine: the hosts come from the allocation, mpirun starts
its daemons through srun (Open MPI's plm slurm), the checks run through srun.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers.elastic import discovery, every_epoch, last_pass, probe_args
from helpers.jobs import records, start_job
from helpers.procs import cmdline, survivors
from helpers.slurm_bed import SlurmCluster
from helpers.suite import SCRIPTS, dtlaunch_argv, recording_thread_imports

pytestmark = pytest.mark.testbed
PROBE = str(SCRIPTS / "rank_probe.py")


def salloc(nodes: int, name: str, *argv: str) -> list[str]:
    return ["salloc", f"--nodes={nodes}", f"--job-name={name}", *argv]


def rank_pids(cluster: SlurmCluster, marker: str) -> list[int]:
    """Processes on any node whose command line holds `marker` (this test's output dir)."""
    return [pid for host in cluster.nodes for pid in cluster.bed.pids_in(host)
            if marker.encode() in cmdline(pid)]


def wait_gone(cluster: SlurmCluster, marker: str) -> list[int]:
    return survivors(lambda: rank_pids(cluster, marker))


def test_run_places_ranks_on_the_allocated_nodes_and_allreduces(
    slurm_cluster: SlurmCluster, tmp_path: Path, horovod: None
) -> None:
    """Pre-flight through srun, then 2 ranks per node by slot in the allocation's order;
    none on this machine; Horovod's allreduce across both nodes gives the right sum."""
    proc = slurm_cluster.run(*salloc(2, "dtl-run"), *dtlaunch_argv(
        "run", "-v", "--iface", slurm_cluster.bed.subnet, "-np", "4", PROBE, "--out",
        str(tmp_path), "--horovod"), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "hosts from Slurm job " in proc.stderr and "launcher slurm" in proc.stderr
    assert "--mca plm slurm" in proc.stderr and "plm_rsh" not in proc.stderr
    assert "pre-flight:" in proc.stderr
    found = records(tmp_path)
    assert sorted(found) == [0, 1, 2, 3]
    assert {r["allreduce_sum"] for r in found.values()} == {10.0}
    hosts = [str(found[r]["host"]) for r in range(4)]
    first, second = sorted(set(hosts))  # Slurm lists h1..h3 in order; both nodes used
    assert socket.gethostname() not in hosts
    cpus = slurm_cluster.cpus
    expected = [first if r < cpus else second for r in range(4)] if cpus < 4 else [first] * 4
    assert hosts == expected
    for r in found.values():
        env = r["env"]
        assert isinstance(env, dict) and "SLURM_STEP_ID" in env  # started by srun, not ssh
    slurm_cluster.wait_idle(60)


def test_gloo_ranks_start_through_srun_on_the_allocated_nodes(
    slurm_cluster: SlurmCluster, tmp_path: Path, horovod: None
) -> None:
    """--gloo inside an allocation: each node's agent is a one-task srun step (no ssh), the
    ranks get the Gloo contract and none of srun's one-task identity or the launcher's
    secrets, and Horovod's allreduce over Gloo gives the right sum."""
    proc = slurm_cluster.run(*salloc(2, "dtl-gloo"), *dtlaunch_argv(
        "run", "--gloo", "-x", "PUBLIC_SETTING", "--iface", slurm_cluster.bed.subnet, "-np",
        "4", PROBE, "--out", str(tmp_path), "--horovod"), timeout=300,
        env={**os.environ, "API_TOKEN": "s3cret-token", "PUBLIC_SETTING": "on"})
    assert proc.returncode == 0, proc.stderr
    found = records(tmp_path)
    assert sorted(found) == [0, 1, 2, 3]
    assert {r["allreduce_sum"] for r in found.values()} == {10.0}
    hosts = {str(r["host"]) for r in found.values()}
    assert socket.gethostname() not in hosts and hosts <= set(slurm_cluster.nodes)
    for r in found.values():
        env = r["env"]
        assert isinstance(env, dict)
        assert env["HOROVOD_CONTROLLER"] == "gloo" and "SLURM_STEP_ID" in env  # srun, not ssh
        assert "SLURM_PROCID" not in env and "OMPI_COMM_WORLD_RANK" not in env
        assert env.get("PUBLIC_SETTING") == "on" and "API_TOKEN" not in env
    slurm_cluster.wait_idle(60)


def test_torch_workers_start_through_srun_with_torchruns_contract(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """--torch inside an allocation: each node's agent is a one-task srun step (no ssh), host
    0's agent holds the store on its node's address, and every worker gets torchrun's contract
    and none of srun's one-task identity."""
    proc = slurm_cluster.run(*salloc(2, "dtl-torch"), *dtlaunch_argv(
        "run", "--torch", "--iface", slurm_cluster.bed.subnet, "-np", "4",
        str(SCRIPTS / "torch_probe.py"), "--out", str(tmp_path)), timeout=300)
    assert proc.returncode == 0, proc.stderr
    found = records(tmp_path)
    assert sorted(found) == [0, 1, 2, 3]
    assert {r["sum"] for r in found.values()} == {10.0}
    hosts = [str(found[r]["host"]) for r in range(4)]
    assert socket.gethostname() not in hosts and set(hosts) <= set(slurm_cluster.nodes)
    first = slurm_cluster.bed.host(hosts[0]).address
    for rank, r in found.items():
        assert r["RANK"] == str(rank) and r["WORLD_SIZE"] == "4" and r["launched"]
        assert r["MASTER_ADDR"] == first and r["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert r["GROUP_RANK"] == str(sorted(set(hosts), key=hosts.index).index(r["host"]))
        assert r["SLURM_STEP_ID"] is not None and r["SLURM_PROCID"] is None  # srun, not ssh
    slurm_cluster.wait_idle(60)


def test_elastic_job_grows_and_shrinks_through_srun(
    slurm_cluster: SlurmCluster, tmp_path: Path, horovod: None
) -> None:
    """An elastic job inside a 3-node allocation: each node's agent is a srun step; the job
    grows when the discovery script lists a third node and shrinks when it drops one."""
    schedule = [["h1:1", "h2:1"], ["h1:1", "h2:1"], ["h1:1", "h2:1", "h3:1"],
                ["h1:1", "h2:1", "h3:1"], ["h1:1", "h3:1"]]
    script, hosts = discovery(tmp_path, schedule[0])
    proc = slurm_cluster.run(*salloc(3, "dtl-elastic"), *dtlaunch_argv(
        "run", "--no-check", "--iface", slurm_cluster.bed.subnet, "--host-discovery-script",
        str(script), "--min-np", "2", *probe_args(tmp_path, hosts, schedule, "--epochs", "7")),
        timeout=300)
    assert proc.returncode == 0, proc.stderr
    found = every_epoch(tmp_path, 7)
    sizes = [int(last_pass(found[e])[0]["size"]) for e in range(7)]  # type: ignore[call-overload]
    assert sizes[0] == 2 and 3 in sizes and sizes[-1] == 2, sizes
    assert {r["host"] for r in last_pass(found[6])} == {"h1", "h3"}
    assert "removed from elastic job" not in proc.stdout + proc.stderr
    slurm_cluster.wait_idle(60)


def test_rank_failure_names_rank_and_node(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """-H picks allocated nodes; --output-dir keeps each rank's lines on this machine."""
    logs = tmp_path / "logs"
    proc = slurm_cluster.run(*salloc(2, "dtl-fail"), *dtlaunch_argv(
        "run", "--no-check", "--iface", slurm_cluster.bed.subnet, "-np", "2", "-H", "h1:1,h2:1",
        "--output-dir", str(logs), PROBE, "--out", str(tmp_path), "--exit-rank", "1",
        "--exit-code", "3"), timeout=180)
    assert proc.returncode != 0
    assert "rank 1 on host h2 exited with code 3" in proc.stderr, proc.stderr
    assert "rank 1 of 2 on h2" in (logs / "rank.1.log").read_text()
    slurm_cluster.wait_idle(60)


def test_host_outside_the_allocation_is_refused(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    proc = slurm_cluster.run(*salloc(1, "dtl-outside"), "--nodelist=h1", *dtlaunch_argv(
        "run", "--no-check", "-H", "h3", PROBE, "--out", str(tmp_path)), timeout=120)
    assert proc.returncode == 2
    assert "h3 not in Slurm job" in proc.stderr
    assert records(tmp_path) == {}


def _start_sleeping_job(cluster: SlurmCluster, out: Path, name: str) -> subprocess.Popen[str]:
    argv = [*salloc(2, name), *dtlaunch_argv(
        "run", "--no-check", "--iface", cluster.bed.subnet, "-np", "2", "-H", "h1:1,h2:1",
        PROBE, "--out", str(out), "--sleep", "300")]
    return start_job(argv, out, 2, env=cluster.env(), start_new_session=True)


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, err


@pytest.mark.parametrize(("sig", "expected"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_exits_128_plus_and_leaves_nothing_on_any_node(
    slurm_cluster: SlurmCluster, tmp_path: Path, sig: signal.Signals, expected: int
) -> None:
    proc = _start_sleeping_job(slurm_cluster, tmp_path, f"dtl-{sig.name}")
    try:
        dtlaunch = [p for p in _children(proc.pid)
                    if b"dtlaunch" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(dtlaunch) == 1
        os.kill(dtlaunch[0], sig)
        assert wait_gone(slurm_cluster, str(tmp_path)) == []
    finally:
        code, err = _finish(proc)
    assert code == expected, err
    slurm_cluster.wait_idle(60)


def test_scancel_ends_everything(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    name = f"dtl-scancel-{os.getpid()}"
    proc = _start_sleeping_job(slurm_cluster, tmp_path, name)
    try:
        cancel = slurm_cluster.run("scancel", f"--name={name}", timeout=30)
        assert cancel.returncode == 0, cancel.stderr
        assert wait_gone(slurm_cluster, str(tmp_path)) == []
    finally:
        code, _ = _finish(proc)
    assert code != 0
    slurm_cluster.wait_idle(60)


def test_doctor_checks_exactly_the_allocated_nodes_through_srun(slurm_cluster: SlurmCluster) -> None:
    """The script exists on this machine only (each node has a private /tmp): every node is
    named with the fix, and the nodes were reached through srun."""
    with tempfile.TemporaryDirectory(prefix="dtl-doctor-") as where:
        script = Path(where) / "prog.py"
        script.write_text("print('hi')\n")
        log = Path(where) / "thread_imports.txt"
        proc = slurm_cluster.run(*salloc(3, "dtl-doctor"), *dtlaunch_argv(
            "doctor", "--json", "--timeout", "120", str(script)), timeout=300,
            env={**os.environ, **recording_thread_imports(log)})
        assert not log.exists(), log.read_text()  # the srun probes' threads import nothing
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["reach"] == "srun"
    nodes = {h["host"]: h for h in report["hosts"] if h["role"] == "host"}
    assert sorted(nodes) == ["h1", "h2", "h3"]
    for host, entry in nodes.items():
        assert entry["hostname"] == host
        checks = {c["name"]: c for c in entry["checks"]}
        assert checks["reach"]["detail"] == "srun"  # reached through srun, not SSH
        assert checks["script"]["status"] == "fail", checks
        assert checks["script"]["hint"]
    slurm_cluster.wait_idle(60)


def test_submit_runs_every_rank_and_completes(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    proc = slurm_cluster.run(*dtlaunch_argv(
        "submit", "-N", "2", "--job-name", "dtl submit", "-o", str(tmp_path / "job-%j.out"),
        "--", "--no-check", "--iface", slurm_cluster.bed.subnet, "-np", "4",
        PROBE, "--out", str(tmp_path)), timeout=120)
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.split()
    job = words[words.index("job") + 1].rstrip(";")
    assert proc.stdout.strip().endswith(str(tmp_path / f"job-{job}.out"))
    state = slurm_cluster.wait_job_ended(job)
    text = (tmp_path / f"job-{job}.out").read_text()
    assert state == "COMPLETED", text
    for rank in range(4):
        assert f"rank {rank} of 4 on h" in text, text
    slurm_cluster.wait_idle(60)


def submitted_job(proc: subprocess.CompletedProcess[str]) -> str:
    words = proc.stdout.split()
    return words[words.index("job") + 1].rstrip(";")


@pytest.mark.parametrize("form", [["-N2", "--hold"], ["--time=10", "--hold"],
                                  ["--exclusive", "--hold"], ["--hold", "-N", "1"]])
def test_submit_takes_the_forms_the_readme_names(slurm_cluster: SlurmCluster, tmp_path: Path,
                                                 form: list[str]) -> None:
    """Joined values, `--name=value` and flags before `--` reach a real sbatch (held, so
    nothing runs), and its stored batch script runs `dtlaunch run` with the rest (issue 27)."""
    proc = slurm_cluster.run(*dtlaunch_argv("submit", *form, "--", "--no-check", "-np", "1",
                                            PROBE, "--out", str(tmp_path)),
                             timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    job = submitted_job(proc)
    try:
        assert slurm_cluster.job_state(job) == "PENDING"
        stored = slurm_cluster.run("scontrol", "write", "batch_script", job, "-", timeout=30)
        assert stored.returncode == 0, stored.stderr
        assert f"-m dtlaunch run --no-check -np 1 {PROBE} --out {tmp_path}" in stored.stdout
    finally:
        slurm_cluster.run("scancel", job, timeout=30)


def test_submit_with_no_sbatch_options_runs_and_completes(slurm_cluster: SlurmCluster,
                                                          tmp_path: Path) -> None:
    proc = slurm_cluster.run(*dtlaunch_argv("submit", "--", "--no-check", "-np", "1", PROBE,
                                            "--out", str(tmp_path)), timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    job = submitted_job(proc)
    state = slurm_cluster.wait_job_ended(job)
    text = (tmp_path / f"dtlaunch-{job}.out").read_text()
    assert state == "COMPLETED", text
    assert "rank 0 of 1 on h" in text, text
    slurm_cluster.wait_idle(60)


@pytest.mark.parametrize(("run_part", "message"), [
    (["-np", "0", PROBE], "-np: must be at least 1"),
    (["--no-such-option", PROBE], "unknown option --no-such-option"),
    (["missing_script.py"], "script not found: missing_script.py"),
    (["--env-file", "{tmp}", PROBE], "is a directory"),
    (["--timeout", "-1", PROBE], "--timeout"),
    (["-x", "1BAD", PROBE], "invalid variable name '1BAD'"),
    (["-x", "AWS_SECRET_ACCESS_KEY=s3cr3t-value", PROBE], "pass -x AWS_SECRET_ACCESS_KEY"),
])
def test_submit_queues_nothing_run_would_refuse(slurm_cluster: SlurmCluster, tmp_path: Path,
                                                run_part: list[str], message: str) -> None:
    """Refused before sbatch, exit 2: no job that would only print a usage error, and no
    secret's value in a batch script Slurm keeps (issue 27)."""
    name = f"dtl-refused-{tmp_path.name}"[:60]
    before = slurm_cluster.run("squeue", "-h", "-o", "%i", timeout=30).stdout.split()
    proc = slurm_cluster.run(*dtlaunch_argv(
        "submit", "-N1", "-t2", f"--job-name={name}", "--",
        *(w.format(tmp=tmp_path) for w in run_part)), timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and "s3cr3t" not in proc.stdout + proc.stderr
    assert proc.stdout == ""
    everything = slurm_cluster.run("scontrol", "show", "job", "-o", timeout=30).stdout
    assert f"JobName={name}" not in everything
    assert slurm_cluster.run("squeue", "-h", "-o", "%i", timeout=30).stdout.split() == before


def test_doctor_names_a_node_missing_the_interpreter(slurm_cluster: SlurmCluster) -> None:
    """--python in the launcher's private /tmp: every node lacks it and is named with the fix."""
    with tempfile.TemporaryDirectory(prefix="dtl-python-") as where:
        python = Path(where) / "python3"
        python.symlink_to(sys.executable)
        proc = slurm_cluster.run(*salloc(2, "dtl-doctor-py"), *dtlaunch_argv(
            "doctor", "--json", "--python", str(python)), timeout=300)
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    nodes = [h for h in report["hosts"] if h["role"] == "host"]
    assert len(nodes) == 2
    for entry in nodes:
        check = next(c for c in entry["checks"] if c["name"] == "python")
        assert check["status"] == "fail" and str(python) in check["detail"] + check["hint"], check
        assert check["hint"]
    slurm_cluster.wait_idle(60)
