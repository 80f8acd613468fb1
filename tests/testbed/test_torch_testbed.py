"""dtlaunch run --torch on the real test bed: real sshd, real torch.distributed workers (Gloo
on CPU), no MPI, no Horovod: torchrun's contract on every worker, a store that is the job's
alone, a failed worker that ends the job at once, nothing left behind."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.jobs import (
    assert_no_strays,
    assert_sigkill_on_h1_leaves_nothing,
    assert_stopped_by,
    records,
    start_job,
)
from helpers.procs import HANG
from helpers.suite import SCRIPTS, dtlaunch_argv
from helpers.testbed import TestBed

from dtlaunch.core.errors import EXIT_TIMEOUT

pytestmark = pytest.mark.testbed
PROBE = str(SCRIPTS / "torch_probe.py")


def torch_argv(bed: TestBed, hosts: str, *args: str, check: bool = False) -> list[str]:
    return dtlaunch_argv("run", "--torch", *([] if check else ["--no-check", "--iface", bed.subnet]),
                         "-H", hosts, "--ssh-config", str(bed.ssh_config), *args)


def run_torch(bed: TestBed, hosts: str, *args: str, check: bool = False,
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(torch_argv(bed, hosts, *args, check=check), capture_output=True,
                          text=True, timeout=HANG)


def test_torchruns_contract_on_every_worker_after_the_preflight(bed: TestBed,
                                                                tmp_path: Path) -> None:
    result = run_torch(bed, "h1:2,h2:1,h3:1", "--local-rank-arg=--local-rank", PROBE, "--out",
                       str(tmp_path), check=True)
    assert result.returncode == 0, result.stderr
    found = records(tmp_path)
    assert sorted(found) == [0, 1, 2, 3]
    assert [found[r]["host"] for r in range(4)] == ["h1", "h1", "h2", "h3"]
    assert all(r["sum"] == 10.0 and r["launched"] for r in found.values())  # 1 + 2 + 3 + 4
    env = {r: found[r] for r in range(4)}
    assert [env[r]["LOCAL_RANK"] for r in range(4)] == ["0", "1", "0", "0"]
    assert [env[r]["LOCAL_WORLD_SIZE"] for r in range(4)] == ["2", "2", "1", "1"]
    assert [env[r]["GROUP_RANK"] for r in range(4)] == ["0", "0", "1", "2"]
    assert [found[r]["local_rank_arg"] for r in range(4)] == [0, 1, 0, 0]
    assert found[1]["argv"][-1] == "--local-rank=1"
    for r, e in env.items():
        assert (e["RANK"], e["ROLE_RANK"], e["WORLD_SIZE"], e["ROLE_WORLD_SIZE"],
                e["GROUP_WORLD_SIZE"], e["ROLE_NAME"]) == (str(r), str(r), "4", "4", "3",
                                                           "default")
        # MASTER_ADDR: host 0's address on the job's network, never a name.
        assert e["MASTER_ADDR"] == bed.host("h1").address
        assert e["MASTER_PORT"] == env[0]["MASTER_PORT"]
        assert e["TORCHELASTIC_RUN_ID"] == env[0]["TORCHELASTIC_RUN_ID"] != "none"
        assert (e["TORCHELASTIC_USE_AGENT_STORE"], e["TORCHELASTIC_RESTART_COUNT"],
                e["TORCHELASTIC_MAX_RESTARTS"], e["TORCH_NCCL_ASYNC_ERROR_HANDLING"]) == (
                    "True", "0", "0", "1")
        # The pre-flight's network by its name there (NCCL's "=": that name exactly).
        assert (e["GLOO_SOCKET_IFNAME"], e["NCCL_SOCKET_IFNAME"]) == ("eth0", "=eth0")
    assert env[0]["OMP_NUM_THREADS"] == "1" and env[2]["OMP_NUM_THREADS"] is None
    assert len({e["TORCHELASTIC_ERROR_FILE"] for e in env.values()}) == 4
    assert "[3@h3]" in result.stdout or result.stdout == ""
    assert_no_strays(bed)


def test_a_failed_worker_ends_the_job_at_once_with_its_recorded_error(
        bed: TestBed, tmp_path: Path) -> None:
    # The others would wait ten minutes in a barrier; the job ends on rank 2's exit, and the
    # root cause carries what torch's @record wrote to TORCHELASTIC_ERROR_FILE.
    result = run_torch(bed, "h1:1,h2:1,h3:1", PROBE, "--out", str(tmp_path), "--raise-rank",
                       "2", "--sleep", "600")
    assert result.returncode == 1, result.stderr
    assert "(@record): RuntimeError: boom on rank 2" in result.stderr, result.stderr
    assert "rank 2 on host h3 exited with code 1" in result.stderr.strip().splitlines()[-1]
    assert_no_strays(bed)


def test_sigint_and_sigkill_leave_nothing_on_any_host(bed: TestBed, tmp_path: Path) -> None:
    first = tmp_path / "int"
    first.mkdir()
    proc = start_job(torch_argv(bed, "h1:1,h2:1,h3:1", PROBE, "--out", str(first), "--sleep",
                                "600"), first, 3)
    try:
        assert_stopped_by(proc, signal.SIGINT)
    finally:
        proc.kill()
    assert_no_strays(bed, pids=tuple(r["pid"] for r in records(first).values()))
    second = tmp_path / "kill"
    second.mkdir()
    proc = start_job(torch_argv(bed, "h1:2,h2:1", PROBE, "--out", str(second), "--sleep",
                                "600"), second, 3)
    pids = tuple(r["pid"] for r in records(second).values())
    proc.kill()
    proc.communicate(timeout=HANG)
    assert_no_strays(bed, pids=pids)


def test_sigkill_of_dtlaunch_on_host_0_leaves_nothing(bed: TestBed, tmp_path: Path) -> None:
    """Started on h1, host 0, whose agent (and the job's store) runs beside dtlaunch without
    ssh: a SIGKILLed dtlaunch still ends every worker on every host."""
    assert_sigkill_on_h1_leaves_nothing(bed, torch_argv(bed, "h1:2,h2:1", PROBE, "--out",
                                        str(tmp_path), "--sleep", "600"), tmp_path)


def test_host_0_serves_until_a_late_host_has_come(bed: TestBed, tmp_path: Path) -> None:
    """Host 0's workers end at once (they never use the store) while h2's agent connects
    seconds later (its ssh runs a LocalCommand first): host 0's agent keeps the store until
    h2's agent has come and gone, and the job succeeds."""
    config = tmp_path / "ssh_config"
    config.write_text("Host h2\n  PermitLocalCommand yes\n  LocalCommand sleep 4\n"
                      + bed.ssh_config.read_text())
    argv = dtlaunch_argv("run", "--torch", "--no-check", "--iface", bed.subnet, "-H", "h1,h2",
                         "--ssh-config", str(config), sys.executable, "-c", "pass")
    result = subprocess.run(argv, capture_output=True, text=True, timeout=HANG)
    assert result.returncode == 0, result.stderr
    assert_no_strays(bed)


# A raw TCPStore client (c10d's wire format: VALIDATE with its magic, then PING): prints what
# the store answered, "" when it closed the connection unanswered.
KNOCK = r"""
import socket, struct, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60) as c:
        c.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE) + bytes([13]) + struct.pack("<I", 77))
        c.settimeout(60)
        print(repr(c.recv(16)))
except OSError as exc:
    print(repr(b""), exc)
"""


def test_the_store_serves_the_job_alone(bed: TestBed, tmp_path: Path) -> None:
    proc = start_job(torch_argv(bed, "h1:1,h2:1", PROBE, "--out", str(tmp_path), "--sleep",
                                "600"), tmp_path, 2)
    try:
        master = records(tmp_path)[0]
        where = [master["MASTER_ADDR"], master["MASTER_PORT"]]
        assert where[0] == bed.host("h1").address
        # Another machine on the network (h3), root on the store's own host outside the job,
        # and another user there: each connection is closed before any answer.
        for host, prefix in (("h3", []), ("h1", []),
                             ("h1", ["setpriv", "--reuid=nobody", "--regid=nogroup",
                                     "--clear-groups"])):
            done = bed.exec_in(host, [*prefix, "/usr/bin/python3", "-I", "-c", KNOCK, *where])
            assert done.stdout.split()[0] == "b''", (host, prefix, done.stdout, done.stderr)
        assert_stopped_by(proc, signal.SIGTERM)
    finally:
        proc.kill()
    assert_no_strays(bed)


def test_doctor_for_torch_skips_mpi_and_horovod(bed: TestBed) -> None:
    done = subprocess.run(dtlaunch_argv("doctor", "--torch", "--json", "-H", "h1,h2",
                                        "--ssh-config", str(bed.ssh_config), PROBE),
                          capture_output=True, text=True, timeout=HANG)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    for host in report["hosts"]:
        checks = {c["name"]: c["status"] for c in host["checks"]}
        assert checks["mpirun"] == checks["horovod"] == "skip", host
        assert checks["torch"] == "pass", host


def test_a_master_port_in_use_is_one_line(bed: TestBed, tmp_path: Path) -> None:
    holder = bed.spawn_in("h1", [sys.executable, "-c", "import socket,time;s=socket.socket();"
                                 f"s.bind(('{bed.host('h1').address}',29577));s.listen();"
                                 "time.sleep(600)"])
    try:
        result = run_torch(bed, "h1:1,h2:1", "--master-port", "29577", PROBE, "--out",
                           str(tmp_path))
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "cannot hold the master port 29577" in last and "Address already in use" in last, \
        result.stderr
    assert_no_strays(bed)


def test_timeout_and_a_restart_with_a_new_store_and_count(bed: TestBed, tmp_path: Path) -> None:
    timed = run_torch(bed, "h1:1,h2:1", "--timeout", "5", PROBE, "--out", str(tmp_path),
                      "--sleep", "600")
    assert timed.returncode == EXIT_TIMEOUT, timed.stderr
    assert_no_strays(bed)
    out = tmp_path / "restarts"
    out.mkdir()
    again = run_torch(bed, "h1:1,h2:1", "--max-restarts", "1", PROBE, "--out", str(out),
                      "--fail-rank", "1", "--fail-attempt", "0")
    assert again.returncode == 0, again.stderr
    found = records(out)  # the second attempt's, which wrote last
    assert all(r["TORCHELASTIC_RESTART_COUNT"] == "1" and r["TORCHELASTIC_MAX_RESTARTS"] == "1"
               for r in found.values()), found
    first = (out / "attempt0.rank1").read_text().split()
    second = (out / "attempt1.rank1").read_text().split()
    assert first[0] == second[0] == "h2" and first[1] != second[1]  # a new run id
    assert_no_strays(bed)


# --- Peer tests: PyTorch's own launcher test clients, unmodified (tests/helpers/peer.py fetches
# them from Debian's source package of PyTorch), through dtlaunch run --torch on 2 hosts x 2
# workers; each asserts what PyTorch's launcher tests (test/distributed/launcher/run_test.py)
# assert of torchrun.


@pytest.fixture(scope="module")
def peer_bin() -> Path:
    from helpers.peer import pytorch_launcher_scripts

    return pytorch_launcher_scripts()


def run_peer(bed: TestBed, *args: str) -> subprocess.CompletedProcess[str]:
    return run_torch(bed, "h1,h2", "--nproc-per-node", "2", *args)


def test_peer_test_script_sees_torchruns_variables_and_touches_one_file_per_rank(
        bed: TestBed, peer_bin: Path, tmp_path: Path) -> None:
    # test_script.py reads every variable torchrun sets (os.environ[...] raises on a missing
    # one), TEST_SENTINEL_PARENT among them: the launching environment's, passed by -x.
    result = run_peer(bed, "-x", "TEST_SENTINEL_PARENT=sentinel", str(peer_bin / "test_script.py"),
                      f"--touch_file_dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert {p.name for p in tmp_path.iterdir()} == {"0", "1", "2", "3"}
    assert result.stdout.count("Success, created") == 4
    assert "TEST_SENTINEL_PARENT = sentinel" in result.stdout
    assert_no_strays(bed)


def test_peer_test_script_failing_fails_the_job_with_its_error(bed: TestBed, peer_bin: Path,
                                                               tmp_path: Path) -> None:
    result = run_peer(bed, "-x", "TEST_SENTINEL_PARENT=sentinel", str(peer_bin / "test_script.py"),
                      "--fail", f"--touch_file_dir={tmp_path}")
    assert result.returncode == 1, result.stderr
    assert "raising exception since --fail flag was set" in result.stderr
    assert not list(tmp_path.iterdir())
    assert_no_strays(bed)


def test_peer_shell_script_runs_as_a_worker(bed: TestBed, peer_bin: Path,
                                            tmp_path: Path) -> None:
    # torchrun --no-python's case: the worker is not Python.
    result = run_peer(bed, "bash", str(peer_bin / "test_script.sh"), str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert {p.name for p in tmp_path.iterdir()} == {"0", "1", "2", "3"}
    assert_no_strays(bed)


def test_peer_local_rank_argument_matches_local_rank(bed: TestBed, peer_bin: Path) -> None:
    # torch.distributed.launch's contract: --local_rank=N appended, N == LOCAL_RANK.
    result = run_peer(bed, "--local-rank-arg", "--local_rank",
                      str(peer_bin / "test_script_local_rank.py"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("End execution") == 4
    assert_no_strays(bed)


def test_peer_is_torchelastic_launched(bed: TestBed, peer_bin: Path, tmp_path: Path) -> None:
    out = tmp_path / "launched"
    result = run_peer(bed, str(peer_bin / "test_script_is_torchelastic_launched.py"),
                      f"--out_file={out}")
    assert result.returncode == 0, result.stderr
    assert out.read_text() == "True"
    assert_no_strays(bed)


def test_peer_init_method_env_all_reduces_across_hosts(bed: TestBed, peer_bin: Path) -> None:
    # init_process_group("env://") on the job's store; a one-hot all_reduce gives the world.
    result = run_peer(bed, str(peer_bin / "test_script_init_method.py"), "--init_method=env://")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("Done") == 4
    assert_no_strays(bed)
