"""--gloo's pure parts and its rendezvous store, through the host agent's own forwarder: each
rank's place in the job, and a store that serves only requests signed with the job's secret."""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import pickle
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.store_http import read_answer

from dtlaunch.agents import gloo_host
from dtlaunch.gloo.ranks import host_ifaces, place_ranks, scope_sizes
from dtlaunch.gloo.rendezvous import Store, split_path

SECRET = b"s" * 32
ROOT = Path(__file__).resolve().parents[2]


def test_ranks_fill_hosts_in_order_with_local_and_cross_places() -> None:
    ranks = place_ranks(["h1", "h1", "h2"])  # -np 3 on h1:2,h2:2
    assert [(r.rank, r.host, r.local_rank, r.local_size, r.cross_rank, r.cross_size)
            for r in ranks] == [(0, "h1", 0, 2, 0, 2), (1, "h1", 1, 2, 0, 1),
                                (2, "h2", 0, 1, 1, 2)]
    env = ranks[2].env(3)
    assert env["HOROVOD_CONTROLLER"] == env["HOROVOD_CPU_OPERATIONS"] == "gloo"
    assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_HOSTNAME"]) == ("2", "3", "h2")
    assert scope_sizes(ranks) == {"global": 3, "local_h1": 2, "local_h2": 1, "cross_0": 2,
                                  "cross_1": 1}


def test_each_host_gets_its_own_interface_name() -> None:
    names = (("h1", ("eth0",)), ("h2", ("ens5", "ens6")))
    assert host_ifaces(names, None, ["h1", "h2", "h3"]) == {"h1": "eth0", "h2": "ens5"}
    assert host_ifaces((), "eth1", ["h1"]) == {"h1": "eth1"}


@pytest.mark.parametrize("path", [b"/global/rank_0", b"/local_h1.example.com/0",
                                  b"/cross_0_process_set_hash_7d48/rank_1"])
def test_horovod_paths_are_taken(path: bytes) -> None:
    assert split_path(path) is not None


@pytest.mark.parametrize("path", [b"/", b"/a", b"/a/b/c", b"a/b", b"/a/", b"/../b", b"/a/%2e",
                                  b"/a/b?x=1", "/é/b".encode(), b"/" + b"a" * 300 + b"/b"])
def test_other_paths_are_not(path: bytes) -> None:
    assert split_path(path) is None


@pytest.fixture
def store() -> Iterator[Store]:
    with contextlib.closing(Store(["127.0.0.1"], SECRET, {"global": 2})) as running:
        running.start()
        yield running


@pytest.fixture
def forwarder(store: Store) -> Iterator[gloo_host.Forwarder]:
    fwd = gloo_host.Forwarder("127.0.0.1", store.port, SECRET)
    fwd.start()
    yield fwd
    fwd.close()


def http(port: int, raw: bytes) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(raw)
        status, _, body = read_answer(conn)
    return status, body


def request(method: str, path: str, body: bytes = b"", extra: str = "") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
            .encode() + body)


def signed(method: bytes, path: bytes, body: bytes, nonce: bytes, secret: bytes = SECRET) -> bytes:
    mac = gloo_host.request_mac(secret, method, path, nonce, body)
    extra = f"X-Dtlaunch-Nonce: {nonce.decode()}\r\nX-Dtlaunch-Auth: {mac}\r\n"
    return request(method.decode(), path.decode(), body, extra)


def test_ranks_store_and_read_through_their_forwarder(forwarder: gloo_host.Forwarder,
                                                      store: Store) -> None:
    assert http(forwarder.port, request("GET", "/global/0")) == (404, b"")
    assert http(forwarder.port, request("PUT", "/global/0", b"\x00addr\xff")) == (200, b"")
    assert http(forwarder.port, request("GET", "/global/0")) == (200, b"\x00addr\xff")
    # Horovod's meaning of DELETE: the layout's scope is cleared once all its ranks are done.
    assert http(forwarder.port, request("DELETE", "/global/0"))[0] == 200
    assert http(forwarder.port, request("GET", "/global/0"))[0] == 200
    assert http(forwarder.port, request("DELETE", "/global/1"))[0] == 200
    assert http(forwarder.port, request("GET", "/global/0"))[0] == 404
    # One connection, several requests (keep-alive), as an HTTP client may send them.
    with socket.create_connection(("127.0.0.1", forwarder.port), timeout=10) as conn:
        for value in (b"a", b"bb"):
            conn.sendall(request("PUT", "/adhoc/k", value))
            assert read_answer(conn)[0] == 200
    assert store.refusals == []


def test_unsigned_forged_replayed_and_oversized_requests_are_refused(store: Store) -> None:
    http(store.port, signed(b"PUT", b"/global/0", b"good", b"a" * 32))
    assert http(store.port, request("GET", "/global/0"))[0] == 401  # no signature
    assert http(store.port, signed(b"PUT", b"/global/0", b"evil", b"b" * 32, b"x" * 32))[0] == 401
    # A body that is not the one signed (a forged body on a captured signature).
    mac = gloo_host.request_mac(SECRET, b"PUT", b"/global/0", b"c" * 32, b"good")
    forged = request("PUT", "/global/0", b"evil",
                     f"X-Dtlaunch-Nonce: {'c' * 32}\r\nX-Dtlaunch-Auth: {mac}\r\n")
    assert http(store.port, forged)[0] == 401
    # A captured request sent again.
    assert http(store.port, signed(b"PUT", b"/global/0", b"good", b"a" * 32))[0] == 401
    # Too large: refused from its Content-Length, before the body is read.
    huge = f"PUT /global/0 HTTP/1.1\r\nContent-Length: {1 << 30}\r\n\r\n".encode()
    assert http(store.port, huge)[0] == 413
    assert http(store.port, b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n")[0] == 431
    assert http(store.port, b"\x80\x04\x95garbage\r\n\r\n")[0] == 400  # a pickle is not a request
    assert len(store.refusals) == 7
    # Nothing of it changed the store; signed requests still work.
    nonce = binascii.hexlify(os.urandom(16))
    with socket.create_connection(("127.0.0.1", store.port), timeout=10) as conn:
        conn.sendall(signed(b"GET", b"/global/0", b"", nonce))
        status, headers, body = read_answer(conn)
    assert (status, body) == (200, b"good")
    assert headers["x-dtlaunch-auth"] == gloo_host.response_mac(SECRET, nonce, 200, b"good")


def test_the_forwarder_drops_answers_not_signed_by_the_store() -> None:
    fake = socket.socket()
    fake.bind(("127.0.0.1", 0))
    fake.listen(4)

    def answer() -> None:
        conn, _ = fake.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil")

    threading.Thread(target=answer, daemon=True).start()
    fwd = gloo_host.Forwarder("127.0.0.1", fake.getsockname()[1], SECRET)
    fwd.start()
    try:
        assert http(fwd.port, request("GET", "/global/0")) == (502, b"")
    finally:
        fwd.close()
        fake.close()



def test_dry_run_shows_the_gloo_job_with_variables_by_name_only(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "dtlaunch", "run", "--gloo", "--dry-run", "-H",
                           "h1:2,h2:2", "-np", "3", "-x", "DTL_VALUE=s3cr3t", "python", "t.py"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert "dtlaunch-gloo -np 3 -H h1:2,h2:2" in line and "-x DTL_VALUE python t.py" in line
    assert "s3cr3t" not in done.stdout
    assert "StrictHostKeyChecking=yes" in line


def test_mpi_only_options_are_refused_under_gloo(tmp_path: Path) -> None:
    for extra, word in ((["--mpi-args", "-v"], "--mpi-args"), (["--tree-spawn"], "--tree-spawn"),
                        (["--binding-args", "-bind-to core"], "--binding-args")):
        done = subprocess.run([sys.executable, "-m", "dtlaunch", "run", "--gloo", "--dry-run",
                               "-H", "h1", *extra, "python", "t.py"], capture_output=True,
                              text=True, timeout=60, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines()[-1] == (
            f"dtlaunch: error: {word}: no MPI launcher runs under --gloo; drop it")


def test_the_store_listens_only_where_it_is_told_and_says_why_it_cannot() -> None:
    with contextlib.closing(Store(["127.0.0.1", "127.0.0.2"], SECRET)) as running:
        running.start()
        assert running.port > 0
        for address in ("127.0.0.1", "127.0.0.2"):
            socket.create_connection((address, running.port), timeout=5).close()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.3", running.port), timeout=5).close()
    from dtlaunch.core.errors import DtlaunchError

    with pytest.raises(DtlaunchError, match=r"cannot listen on 192\.0\.2\.77"):
        Store(["192.0.2.77"], SECRET).start()  # not an address of this machine


def test_inside_a_slurm_allocation_each_agent_is_a_one_task_step_that_keeps_no_secret() -> None:
    from dtlaunch.gloo.family import GLOO
    from dtlaunch.gloo.start import srun_argv
    from dtlaunch.job.hosts import Host
    from dtlaunch.plan.plan import RunRequest, plan_run

    request = RunRequest(hosts=(Host("n1", 1), Host("n2", 1)), python="python", script="t.py",
                         via="slurm", controller="gloo")
    slurm_env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]"}
    planned = plan_run(request, slurm_env, family=GLOO)
    assert planned.launcher_env["SLURM_JOB_ID"] == "7"  # srun runs inside the allocation
    argv = srun_argv("n2", ["/venv/bin/python", "-I", "-S", "-c", "boot"])
    assert argv[:6] == ["srun", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=n2",
                        "--kill-on-bad-exit=1"]
    assert argv[-5:] == ["/venv/bin/python", "-I", "-S", "-c", "boot"]  # no shell, no quoting
    export = next(a for a in argv if a.startswith("--export="))
    # Only a login's basics: the ranks get the allow-list's variables from standard input.
    assert export.split("=", 1)[1].split(",") == ["HOME", "USER", "LOGNAME", "PATH", "LANG",
                                                   "TERM"]
    plan = plan_run(RunRequest(hosts=(Host("n1", 2), Host("n2", 2)), python="python",
                               script="t.py", num_proc=3, via="ssh", controller="gloo"),
                    {}, family=GLOO)
    assert plan.rank_hosts == ("n1", "n1", "n2")  # exactly -np, hosts filled in order


def test_timed_nonces_are_refused_when_too_old_and_forgotten_later() -> None:
    import time as _time

    from dtlaunch.gloo import rendezvous

    store = Store(["127.0.0.1"], SECRET)
    now = int(_time.time())
    fresh = f"{now:x}-".encode() + binascii.hexlify(os.urandom(16))
    old = f"{now - 2 * 3600:x}-".encode() + binascii.hexlify(os.urandom(16))
    mac = gloo_host.request_mac(SECRET, b"GET", b"/global/0", fresh, b"")
    assert store._authentic(b"GET", b"/global/0", fresh, b"", mac)
    assert not store._authentic(b"GET", b"/global/0", fresh, b"", mac)  # a replay
    old_mac = gloo_host.request_mac(SECRET, b"GET", b"/global/0", old, b"")
    assert not store._authentic(b"GET", b"/global/0", old, b"", old_mac)  # too old
    bad = b"zz-" + binascii.hexlify(os.urandom(16))
    assert not store._authentic(b"GET", b"/global/0", bad, b"",
                                gloo_host.request_mac(SECRET, b"GET", b"/global/0", bad, b""))
    # Remembered until it could no longer be taken anyway, then forgotten.
    assert store._nonces[fresh] > _time.time() + rendezvous.NONCE_MAX_AGE


def test_ranks_cannot_reach_the_drivers_scopes_and_their_notice_address_stays_here(
        forwarder: gloo_host.Forwarder, store: Store) -> None:
    """An elastic job's control scopes (plans, worker ends) are the host agent's alone; a
    rank's Horovod registration (a base64 pickle of its notification service's addresses and
    key) is kept by the forwarder, read with no class allowed, and never sent to the store."""
    seen: list[tuple[bytes, str]] = []

    def hook(method: bytes, key: str, body: bytes) -> tuple[int, bytes]:
        seen.append((method, key))
        return 200, b"{}"

    store.hooks = {"_dtlaunch_plan": hook, "_dtlaunch_exit": hook, "worker_addresses": hook}
    assert http(forwarder.port, request("GET", "/_dtlaunch_plan/h1:1:-1"))[0] == 403
    assert http(forwarder.port, request("PUT", "/_dtlaunch_exit/h1:0:0", b"0"))[0] == 403
    body = base64.b64encode(pickle.dumps(({"eth0": [("10.0.0.1", 4321)]}, b"k" * 32)))
    assert http(forwarder.port, request("PUT", "/worker_addresses/h1:0", body)) == (200, b"")
    assert forwarder.workers == {0: (4321, b"k" * 32)}
    assert http(forwarder.port, request("PUT", "/worker_addresses/h1:1", b"junk"))[0] == 400
    assert seen == []  # none of it reached the store
    # The agent itself signs and reaches them.
    assert forwarder._forward(b"GET", b"/_dtlaunch_plan/h1:1:-1", b"") == (200, b"{}")
    assert seen == [(b"GET", "h1:1:-1")]


@pytest.mark.parametrize("name", ["node7", "node7.cluster"])
def test_this_machines_own_name_is_local_for_gloo_as_for_the_prober(
        monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """-H <this machine's hostname>,h2: doctor (the prober) took it as this machine while the
    Gloo agent ssh-ed to itself ("lost the SSH connection")."""
    from dtlaunch.gloo import start
    from dtlaunch.probe.prober import local_names
    from dtlaunch.reach.ssh_options import SshOptions

    monkeypatch.setattr(socket, "gethostname", lambda: "node7.cluster")
    assert name in local_names()
    entry = start.host_entry(name, {"host": name}, sys.executable, via_srun=False)
    assert not any("rsh" in word for word in entry["argv"]), entry["argv"]
    assert start.store_address(name, SshOptions()) == "127.0.0.1"
