"""Attacks on a --gloo job's rendezvous on the real test bed: another local user on a rank
host against the ranks' forwarder, a host outside the job against the store."""

from __future__ import annotations

import os
import pwd
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.jobs import assert_no_strays
from helpers.procs import HANG, listening_ports, wait_for
from helpers.suite import SCRIPTS, dtlaunch_argv
from helpers.testbed import TestBed

pytestmark = pytest.mark.testbed
READER = str(SCRIPTS / "store_reader.py")
# The other user's interpreter: one any user may run.
SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


@pytest.fixture(scope="module")
def gbed(resolving_bed: TestBed) -> TestBed:
    return resolving_bed


@pytest.fixture
def other_user() -> Iterator[pwd.struct_passwd]:
    """A second local user, made for this test and removed after it."""
    name = "dtl" + secrets.token_hex(4)
    subprocess.run(["useradd", "--no-create-home", "--no-user-group", "--shell",
                    "/usr/sbin/nologin", name], check=True, capture_output=True, timeout=60)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=60)


def gloo_argv(bed: TestBed, hosts: str, *args: str) -> list[str]:
    return dtlaunch_argv("run", "--gloo", "--no-check", "--iface", bed.subnet, "-H", hosts,
                         "--ssh-config", str(bed.ssh_config), "--timeout", "240", *args)


# Another user's process on the rank host: PUT then close at once (the socket lingers in
# FIN_WAIT2, which /proc/net/tcp lists as uid 0), many times; then one request kept open.
INJECT = r"""
import socket, sys
port, tries = int(sys.argv[1]), int(sys.argv[2])
body = b"evil"
request = (b"PUT /probe/evil HTTP/1.1\r\nContent-Length: 4\r\n\r\n" + body)
for _ in range(tries):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            c.sendall(request)
    except OSError:
        pass
with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
    c.sendall(request)
    print(c.recv(100).split(b" ")[1].decode())
"""


def test_another_local_user_cannot_write_into_a_root_jobs_store(
        gbed: TestBed, tmp_path: Path, other_user: pwd.struct_passwd) -> None:
    tmp_path.chmod(0o777)  # the ranks run as root; only the test's files are here
    proc = subprocess.Popen(gloo_argv(gbed, "h1:1", sys.executable, READER, str(tmp_path),
                                      "/probe/evil"),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (tmp_path / "port.0").exists() or proc.poll() is not None,
                 "the rank to start")
        assert proc.poll() is None, proc.communicate()
        port = (tmp_path / "port.0").read_text()
        attack = gbed.exec_in("h1", ["setpriv", f"--reuid={other_user.pw_uid}",
                                     f"--regid={other_user.pw_gid}", "--clear-groups",
                                     SYSTEM_PYTHON, "-I", "-S", "-c", INJECT, port, "400"],
                              timeout=HANG)
        assert attack.stdout.strip() == "403", attack.stderr  # kept open: refused
        (tmp_path / "go").touch()
        _, err = proc.communicate(timeout=HANG)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    # Before: "200 evil" (every time on the test bed with 400 tries).
    assert (tmp_path / "answer.0").read_text() == "404 ", err
    assert_no_strays(gbed)


# A host outside the job holds many connections to the store, each sending one byte every
# 5 s (each read well within the store's timeout); it prints "ready" once they are open, then
# after `seconds` how many the store has closed.
SLOWLORIS = r"""
import socket, sys, time
host, port, count, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
held = []
for _ in range(count):
    try:
        c = socket.create_connection((host, port), timeout=10)
        c.sendall(b"G")
        c.setblocking(False)
        held.append(c)
    except OSError:
        pass
print("ready", len(held), flush=True)
closed = set()
end = time.monotonic() + seconds
while time.monotonic() < end:
    for i, c in enumerate(held):
        if i in closed:
            continue
        try:
            if c.recv(100) == b"":
                closed.add(i)
                continue
            closed.add(i)  # an answer (408): the store is done with it
        except BlockingIOError:
            try:
                c.send(b"E")
            except OSError:
                closed.add(i)
        except OSError:
            closed.add(i)
    time.sleep(5)
print("closed", len(closed), "of", len(held), flush=True)
"""


def test_a_slowloris_from_outside_the_job_neither_starves_nor_outlives_the_store(
        gbed: TestBed, tmp_path: Path) -> None:
    proc = subprocess.Popen(gloo_argv(gbed, "h1:1,h2:1", sys.executable, READER,
                                      str(tmp_path), "/probe/key"),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    attacker = None
    try:
        wait_for(lambda: len(list(tmp_path.glob("port.*"))) >= 2 or proc.poll() is not None,
                 "2 ranks to start")
        assert proc.poll() is None, proc.communicate()
        (host, port), = listening_ports(proc.pid)
        attacker = subprocess.Popen(gbed.nsenter_argv("h3", [
            sys.executable, "-I", "-S", "-c", SLOWLORIS, host, str(port), "600", "25"]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert attacker.stdout is not None
        ready = attacker.stdout.readline().split()
        assert ready[0] == "ready" and int(ready[1]) > 0, (ready, attacker.stderr)
        (tmp_path / "go").touch()  # the ranks read through the store now, under attack
        _, err = proc.communicate(timeout=HANG)
        report, attack_err = attacker.communicate(timeout=HANG)
    finally:
        proc.kill()
        if attacker is not None:
            attacker.kill()
    assert proc.returncode == 0, err
    # Before: "503 " (every slot held by the stranger; Horovod's ranks aborted).
    assert sorted(p.read_text() for p in tmp_path.glob("answer.*")) == ["404 ", "404 "], err
    # Each of the stranger's connections was cut at its request's deadline (10 s).
    closed = report.split()
    assert closed[0] == "closed" and closed[1] == closed[3], (report, attack_err)
    assert_no_strays(gbed)
