"""dtlaunch run --gloo on the real test bed: real sshd, real Horovod ranks with the Gloo
controller, no MPI. The hosts resolve each other's names, as a cluster's nodes do (Horovod's
Gloo process sets look up the host's own name)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.jobs import (
    assert_no_strays,
    assert_sigkill_on_h1_leaves_nothing,
    assert_stopped_by,
    records,
    start_job,
)
from helpers.procs import HANG, cmdline, descendants, listening_ports, wait_for
from helpers.store_http import read_answer
from helpers.suite import SCRIPTS, dtlaunch_argv, recording_thread_imports, require_testbed
from helpers.testbed import TestBed

from dtlaunch.agents import gloo_host
from dtlaunch.core.errors import EXIT_TIMEOUT
from dtlaunch.gloo.rendezvous import Store

pytestmark = pytest.mark.testbed
PROBE = str(SCRIPTS / "rank_probe.py")


@pytest.fixture(scope="module")
def gbed(resolving_bed: TestBed) -> TestBed:
    return resolving_bed


def gloo_argv(bed: TestBed, hosts: str, *args: str, check: bool = False) -> list[str]:
    return dtlaunch_argv("run", "--gloo", *([] if check else ["--no-check", "--iface", bed.subnet]),
                         "-H", hosts, "--ssh-config", str(bed.ssh_config), *args)


def run_gloo(bed: TestBed, hosts: str, *args: str, check: bool = False,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(gloo_argv(bed, hosts, *args, check=check), capture_output=True,
                          text=True, timeout=HANG, env=env)


def test_horovod_allreduce_over_gloo_with_every_place_right(gbed: TestBed, tmp_path: Path,
                                                           horovod: None) -> None:
    # -np 3 of 4 slots: exactly 3 ranks (horovodrun would start one per slot). The full
    # pre-flight runs, without MPI checks, and chooses the network.
    log = tmp_path / "thread_imports.txt"
    result = run_gloo(gbed, "h1:2,h2:2", "-np", "3", PROBE, "--out", str(tmp_path),
                      "--horovod", check=True,
                      env={**os.environ, **recording_thread_imports(log)})
    assert result.returncode == 0, result.stderr
    assert not log.exists(), log.read_text()  # no worker thread imported a module
    found = records(tmp_path)
    assert sorted(found) == [0, 1, 2]
    assert [found[r]["host"] for r in range(3)] == ["h1", "h1", "h2"]
    assert all(r["allreduce_sum"] == 6.0 for r in found.values())  # 1 + 2 + 3
    # local rank, local size, cross rank, cross size, as Horovod itself reports them
    assert [found[r]["layout"] for r in range(3)] == [[0, 2, 0, 2], [1, 2, 0, 1], [0, 1, 1, 2]]
    env = found[2]["env"]
    assert env["HOROVOD_CONTROLLER"] == env["HOROVOD_CPU_OPERATIONS"] == "gloo"
    assert env["HOROVOD_GLOO_IFACE"] == "eth0"  # the pre-flight's network, by its name there
    assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "127.0.0.1"  # the host agent's forwarder
    assert not any(k.startswith(("OMPI_", "PMI", "DTLAUNCH_GLOO")) for k in env)
    assert "[2@h2] rank 2 of 3 on h2" in result.stdout
    assert_no_strays(gbed)


def test_environment_and_secrets_never_on_a_command_line_and_sigterm_ends_all(
        gbed: TestBed, tmp_path: Path) -> None:
    token = secrets.token_hex(12)
    env = {**os.environ, "DTL_TEST_TOKEN": token}
    proc = start_job(gloo_argv(gbed, "h1:1,h2:2", "-x", "DTL_TEST_TOKEN", PROBE, "--out",
                               str(tmp_path), "--sleep", "600"), tmp_path, 3, env=env)
    try:
        assert all(r["env"]["DTL_TEST_TOKEN"] == token for r in records(tmp_path).values())
        # Every process on the hosts, and the job's here (dtlaunch and all it started): no
        # variable's value, no Horovod contract.
        pids = [p for h in gbed.hosts for p in gbed.pids_in(h)]
        pids += [proc.pid, *descendants(proc.pid)]
        for pid in pids:
            line = cmdline(pid)
            assert token.encode() not in line, line
            assert b"HOROVOD_RANK" not in line and b"HOROVOD_GLOO" not in line, line
        assert_stopped_by(proc, signal.SIGTERM)
    finally:
        proc.kill()
    assert_no_strays(gbed)


def test_a_failed_rank_ends_the_job_and_is_named_with_its_host(gbed: TestBed, tmp_path: Path,
                                                              horovod: None) -> None:
    # The other ranks would wait for rank 2 for ten minutes; the job ends on its exit.
    result = run_gloo(gbed, "h1:1,h2:1,h3:1", PROBE, "--out", str(tmp_path), "--horovod",
                      "--exit-rank", "2", "--exit-code", "3", "--sleep", "600")
    assert result.returncode == 3, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "rank 2 on host h3 exited with code 3" in last, result.stderr
    assert_no_strays(gbed)


def test_sigint_ends_every_rank_on_every_host(gbed: TestBed, tmp_path: Path) -> None:
    proc = start_job(gloo_argv(gbed, "h1:1,h2:1,h3:1", PROBE, "--out", str(tmp_path), "--sleep",
                               "600"), tmp_path, 3)
    try:
        assert_stopped_by(proc, signal.SIGINT)
    finally:
        proc.kill()
    assert_no_strays(gbed, pids=tuple(r["pid"] for r in records(tmp_path).values()))


def test_sigkill_of_dtlaunch_leaves_nothing_on_any_host(gbed: TestBed, tmp_path: Path) -> None:
    proc = start_job(gloo_argv(gbed, "h1:2,h2:1", PROBE, "--out", str(tmp_path), "--sleep",
                               "600"), tmp_path, 3)
    pids = tuple(r["pid"] for r in records(tmp_path).values())
    proc.kill()
    proc.communicate(timeout=HANG)
    assert_no_strays(gbed, pids=pids)


def test_sigkill_of_dtlaunch_on_a_host_of_the_job_leaves_nothing(gbed: TestBed,
                                                                 tmp_path: Path) -> None:
    """Started on h1, where h1's agent runs beside dtlaunch without ssh: a SIGKILLed dtlaunch
    still ends every rank, the local ones included."""
    assert_sigkill_on_h1_leaves_nothing(gbed, gloo_argv(gbed, "h1:2,h2:1", PROBE, "--out",
                                        str(tmp_path), "--sleep", "600"), tmp_path)


def test_timeout_and_max_restarts(gbed: TestBed, tmp_path: Path) -> None:
    timed = run_gloo(gbed, "h1:1,h2:1", "--timeout", "3", PROBE, "--out", str(tmp_path),
                     "--sleep", "600")
    assert timed.returncode == EXIT_TIMEOUT, timed.stderr
    assert_no_strays(gbed)
    out = tmp_path / "restarts"
    out.mkdir()
    again = run_gloo(gbed, "h1:1,h2:1", "--max-restarts", "1",
                     str(SCRIPTS / "restart_probe.py"), str(out), "fail-once")
    assert again.returncode == 0, again.stderr
    # Rank 0 of the first attempt may be stopped before it writes: rank 1 fails at once.
    names = {p.name for p in out.iterdir()}
    assert {"attempt0.rank1", "attempt1.rank0", "attempt1.rank1"} <= names <= {
        "attempt0.rank0", "attempt0.rank1", "attempt1.rank0", "attempt1.rank1"}
    assert (out / "attempt1.rank1").read_text().split()[0] == "h2"
    assert_no_strays(gbed)


ATTACK = r"""
import json, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
def send(raw):
    try:
        with socket.create_connection((host, port), timeout=10) as c:
            c.sendall(raw)
            return c.recv(200).split(b" ")[1].decode()
    except OSError as exc:
        return "error " + str(exc)
bad_mac = ("X-Dtlaunch-Nonce: " + "a" * 32 + "\r\nX-Dtlaunch-Auth: " + "0" * 64 + "\r\n")
print(json.dumps([
    send(b"GET /global/0 HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
    send(("PUT /global/0 HTTP/1.1\r\nContent-Length: 4\r\n" + bad_mac + "\r\nevil").encode()),
    send(b"PUT /global/0 HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n"),
    send(b"\x80\x04\x95 pickled \r\n\r\n"),
]))
"""


def test_the_rendezvous_refuses_strangers_and_the_job_is_unharmed(
        gbed: TestBed, tmp_path: Path, horovod: None) -> None:
    go = tmp_path / "go"
    argv = gloo_argv(gbed, "h1:1,h2:1", PROBE, "--out", str(tmp_path), "--horovod",
                     "--wait-for", str(go))
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        # The ranks have started and wait before hvd.init: the store is up, still empty.
        wait_for(lambda: len(list(tmp_path.glob("waiting.*"))) >= 2, "2 ranks to start")
        listening = [a for a in listening_ports(proc.pid)]
        assert len(listening) == 1 and listening[0][0] == gbed.gateway, listening  # not 0.0.0.0
        host, port = listening[0]
        # From h3, another address on the job's network, without the job's secret.
        done = gbed.exec_in("h3", [sys.executable, "-I", "-c", ATTACK, host, str(port)])
        assert json.loads(done.stdout) == ["401", "401", "413", "400"], done.stderr
        go.touch()
        out, err = proc.communicate(timeout=HANG)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    found = records(tmp_path)
    assert sorted(found) == [0, 1] and all(r["allreduce_sum"] == 3.0 for r in found.values())
    assert re.search(r"\[1@h2\] rank 1 of 2 on h2", out)
    assert_no_strays(gbed)


def test_a_changed_host_key_is_refused_and_a_lost_host_ends_the_job(
        make_bed: Callable[..., TestBed], tmp_path: Path) -> None:
    bed = make_bed(2, names_resolve=True)
    bed.restart_with_new_host_key("h2")
    refused = run_gloo(bed, "h1:1,h2:1", PROBE, "--out", str(tmp_path), "--sleep", "600")
    assert refused.returncode != 0
    assert "ssh refused the host key of host h2" in refused.stderr.strip().splitlines()[-1]
    assert_no_strays(bed)
    # The key is trusted again; then h2 drops off the network mid-job.
    known = bed.known_hosts.read_text().splitlines()
    new_key = bed.host("h2").host_key.with_suffix(".pub").read_text()
    bed.known_hosts.write_text("".join(f"{line}\n" for line in known if not line.startswith("h2,"))
                               + f"h2,{bed.host('h2').address} {new_key}")
    out = tmp_path / "lost"
    out.mkdir()
    proc = start_job(gloo_argv(bed, "h1:1,h2:1", PROBE, "--out", str(out), "--sleep", "600"),
                     out, 2)
    try:
        bed.set_link("h2", up=False)
        _, err = proc.communicate(timeout=HANG)
    finally:
        proc.kill()
        bed.set_link("h2", up=True)
    assert proc.returncode != 0
    assert "lost the SSH connection to host h2" in err.strip().splitlines()[-1], err
    assert_no_strays(bed, pids=(records(out)[0]["pid"],))


def test_a_host_whose_own_name_does_not_resolve_is_named(bed: TestBed, tmp_path: Path) -> None:
    # The shared bed's hosts do not resolve their names: Horovod's Gloo ranks would crash.
    result = run_gloo(bed, "h1:1,h2:1", PROBE, "--out", str(tmp_path))
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert re.match(r"dtlaunch: job failed: host h[12]: its own name 'h[12]' does not resolve", last), last
    assert "add it to /etc/hosts" in last
    assert records(tmp_path) == {}  # no rank started
    assert_no_strays(bed)


def test_doctor_for_gloo_skips_the_mpi_checks(gbed: TestBed) -> None:
    done = subprocess.run(dtlaunch_argv("doctor", "--gloo", "--json", "-H", "h1,h2",
                                        "--ssh-config", str(gbed.ssh_config)),
                          capture_output=True, text=True, timeout=HANG)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    for host in report["hosts"]:
        checks = {c["name"]: c for c in host["checks"]}
        assert checks["mpirun"]["status"] == checks["mpi"]["status"] == "skip", host
        assert checks["mpirun"]["detail"] == "not needed (--gloo)"
        assert "Gloo" in checks["horovod"]["detail"]


SECRET = b"k" * 32


def test_the_forwarder_serves_only_its_own_user() -> None:
    """Another user's process on a rank host gets 403 from the ranks' forwarder (root, to
    connect as nobody)."""
    require_testbed()
    with contextlib.closing(Store(["127.0.0.1"], SECRET)) as store:
        store.start()
        forwarder = gloo_host.Forwarder("127.0.0.1", store.port, SECRET)
        forwarder.start()
        try:
            own_user_only(forwarder)
        finally:
            forwarder.close()


def own_user_only(forwarder: gloo_host.Forwarder) -> None:
    code = (f"import socket,sys;c=socket.create_connection(('127.0.0.1',{forwarder.port}),"
            "timeout=10);c.sendall(b'GET /global/0 HTTP/1.1\\r\\nContent-Length: 0\\r\\n\\r\\n');"
            "sys.stdout.write(c.recv(100).decode().split()[1])")
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    done = subprocess.run([python, "-I", "-S", "-c", code], capture_output=True,
                          text=True, timeout=30, user=65534)
    assert done.stdout == "403", done.stderr
    assert plain_get(forwarder.port) == 404  # its own user: served


def plain_get(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"GET /global/0 HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
        return read_answer(conn)[0]
