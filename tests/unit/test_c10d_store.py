"""The job's c10d store (agents/c10d_store.py): PyTorch's own TCPStore client and
`init_process_group(env://)` against it, and its admission: only the job's processes here, only
sockets another host's agent vouches for (HMAC both ways, nothing replays), bounded requests.

Loopback aliases (127.0.0.2, 127.0.0.3) stand for other hosts: the store is told only
127.0.0.1 is local."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dtlaunch.agents import c10d_store as cs

pytest.importorskip("torch")

SECRET = bytes(range(32))
MAGIC = struct.pack("<BI", cs.C10D_VALIDATE, cs.C10D_VALIDATION_MAGIC)


@contextlib.contextmanager
def serve(**kw: Any) -> Iterator[cs.C10dStoreServer]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    server = cs.C10dStoreServer(listener, SECRET, **kw).start()
    try:
        yield server
    finally:
        server.close()


def only_127_0_0_1(ip: str) -> bool:
    return ip == "127.0.0.1"


def connect(server: cs.C10dStoreServer, source: str | None = None) -> socket.socket:
    sock = socket.create_connection(server.address, timeout=10,
                                    source_address=(source, 0) if source else None)
    return sock


def key(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def ping(sock: socket.socket, nonce: int = 4242, validate: bool = True) -> int:
    """VALIDATE (once) then PING; the nonce echoed. Raises on a closed connection."""
    sock.sendall((MAGIC if validate else b"") + struct.pack("<BI", cs.C10D_PING, nonce))
    return int(struct.unpack("<I", recv_exact(sock, 4))[0])


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        data = sock.recv(n - len(buf))
        if not data:
            raise ConnectionError("closed")
        buf += data
    return buf


def closed_without_data(sock: socket.socket, within: float) -> bool:
    """Whether the store closes `sock` within `within` seconds having sent nothing."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def torch_child(code: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


# --- the protocol, through PyTorch's own client ------------------------------------------------


OPERATIONS = """
    import datetime, json, sys
    import torch.distributed as dist
    port = int(sys.argv[1]) if len(sys.argv) > 1 else int(input())
    s = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=20))
    out = {}
    def plain(v):
        return v.decode() if isinstance(v, bytes) else [plain(x) for x in v] if isinstance(v, list) else v
    def say(k, v):
        out[k] = plain(v)
    s.set("a", "1"); say("get", s.get("a"))
    say("add", [s.add("n", 3), s.add("n", -1)])
    say("cas", [s.compare_set("a", "1", "2"), s.compare_set("a", "9", "3"),
                s.compare_set("new", "", "x"), s.compare_set("absent", "e", "y")])
    say("check", [s.check(["a", "n"]), s.check(["a", "nope"])])
    try:
        s.wait(["nope"], datetime.timedelta(milliseconds=300))
        say("wait_timeout", "no error")
    except Exception as err:
        say("wait_timeout", type(err).__name__)
    s.set("nope", "here"); s.wait(["nope"], datetime.timedelta(seconds=5)); say("wait_set", True)
    say("num_keys", s.num_keys())
    say("delete", [s.delete_key("new"), s.delete_key("new")])
    s.multi_set(["m1", "m2"], ["v1", "v2"])
    say("multi_get", [v.decode() for v in s.multi_get(["m1", "m2"])])
    s.append("m1", "+more"); say("append", s.get("m1"))
    s.queue_push("q", "first"); s.queue_push("q", "second")
    say("queue", [s.queue_len("q"), s.queue_pop("q").decode(), s.queue_pop("q", block=False).decode(), s.queue_len("q")])
    try:
        s.queue_pop("q", block=False)
        say("queue_empty", "no error")
    except Exception as err:
        say("queue_empty", type(err).__name__)
    say("list_keys", sorted(s.list_keys()))
    s.barrier("bar", 1, datetime.timedelta(seconds=5)); say("barrier", True)
    print("WAITING", flush=True)
    s.wait(["late"], datetime.timedelta(seconds=20)); say("late", s.get("late"))
    print(json.dumps(out), flush=True)
"""


def raw_set(server: cs.C10dStoreServer, name: bytes, value: bytes) -> None:
    with connect(server) as sock:
        sock.sendall(MAGIC + bytes([cs.C10D_SET]) + key(name) + key(value))
        assert ping(sock, validate=False) == 4242  # the set is done once the ping is answered


def test_every_operation_through_torchs_own_client() -> None:
    with serve() as server:
        child = torch_child(OPERATIONS)
        try:
            assert child.stdin and child.stdout
            child.stdin.write(f"{server.address[1]}\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "WAITING"
            raw_set(server, b"/late", b"at last")  # another connection wakes the waiting one
            out = json.loads(child.stdout.readline())
            assert child.wait(30) == 0
        finally:
            child.kill()
            child.wait()
    assert out["get"] == "1"
    assert out["add"] == [3, 2]
    assert out["cas"] == ["2", "2", "x", "e"]
    assert out["check"] == [True, False]
    assert out["wait_timeout"] == "DistStoreError"
    assert out["wait_set"] is True
    assert out["num_keys"] == 4  # a, n, new, nope
    assert out["delete"] == [True, False]
    assert out["multi_get"] == ["v1", "v2"]
    assert out["append"] == "v1+more"
    assert out["queue"] == [2, "first", "second", 0]
    assert out["queue_empty"] == "QueueEmptyError"
    assert out["list_keys"] == ["a", "m1", "m2", "n", "nope"]
    assert out["barrier"] is True
    assert out["late"] == "at last"


RANK = """
    import datetime, torch, torch.distributed as dist
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    dist.barrier()
    print(t.item(), dist.get_world_size(), flush=True)
    dist.destroy_process_group()
"""


def test_init_process_group_with_the_agent_store() -> None:
    """torchrun's worker environment, TORCHELASTIC_USE_AGENT_STORE=True: every rank is a client
    of this store (none opens a listener), admitted as the job's (descendants of this process)."""
    world = 3
    with serve(root=os.getpid()) as server:
        base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.address[1]),
                "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0",
                "TORCHELASTIC_RUN_ID": "none", "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(world), "GLOO_SOCKET_IFNAME": "lo"}
        ranks = [torch_child(RANK, {**base, "RANK": str(r), "LOCAL_RANK": str(r)})
                 for r in range(world)]
        try:
            outs = [r.communicate(timeout=120)[0] for r in ranks]
        finally:
            for r in ranks:
                r.kill()
                r.wait()
        assert [r.returncode for r in ranks] == [0] * world, outs
        assert all(o.split() == ["6.0", str(world)] for o in outs), outs
        assert server.admitted >= world
        assert server.refused == 0


# --- admission on this host ---------------------------------------------------------------------


def test_a_process_outside_the_job_is_refused_and_the_jobs_own_admitted() -> None:
    other = sleeper()
    try:
        with serve(root=other.pid) as server:
            with connect(server) as sock:  # this process is not the job's
                assert closed_without_data(sock, 5)
            assert server.refused == 1 and server.admitted == 0
        with serve(root=os.getpid()) as server:  # other's parent
            with connect(server) as sock:
                assert ping(sock) == 4242
            assert server.admitted == 1
    finally:
        other.kill()
        other.wait()


def test_a_socket_closed_at_once_is_refused() -> None:
    """Its side shows inode 0 (and uid 0) in FIN_WAIT2: never the job's, whoever made it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    sock = socket.create_connection(listener.getsockname(), timeout=5)
    sock.close()  # before the store accepts it
    time.sleep(0.1)
    server = cs.C10dStoreServer(listener, SECRET, os.getpid()).start()
    try:
        deadline = time.monotonic() + 5
        while server.refused == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.refused == 1 and server.admitted == 0
    finally:
        server.close()


def test_socket_inode_reads_the_exact_four_tuple() -> None:
    other = sleeper()
    try:
        with serve() as server, connect(server) as sock:
            here, there = sock.getsockname(), sock.getpeername()
            inode = cs.socket_inode(here, there)
            assert inode > 0
            assert os.fstat(sock.fileno()).st_ino == inode
            assert cs.c10d_job_owns(os.getpid(), here, there)
            assert not cs.c10d_job_owns(other.pid, here, there)  # another process
            elsewhere = (there[0], there[1] + 1 or 1)
            assert cs.socket_inode(here, elsewhere) == 0
            assert not cs.c10d_job_owns(os.getpid(), here, elsewhere)  # inode 0: never the job's
    finally:
        other.kill()
        other.wait()


# --- admission of other hosts' peers: the agents vouch ----------------------------------------


def remote_store(**kw: Any) -> contextlib.AbstractContextManager[cs.C10dStoreServer]:
    return serve(root=os.getpid(), is_local=only_127_0_0_1, **kw)


def voucher(server: cs.C10dStoreServer, root: int, secret: bytes = SECRET,
            source: str = "127.0.0.2", lost: list[str] | None = None) -> cs.C10dVoucher:
    v = cs.C10dVoucher(server.address, secret, root, source=(source, 0), timeout=5,
                       retry=0.2, on_lost=(lost if lost is not None else []).append)
    return v.start()


def test_a_vouched_remote_connection_is_admitted() -> None:
    with remote_store() as server:
        agent = voucher(server, os.getpid())
        try:
            assert agent.connected.wait(5)
            with connect(server, "127.0.0.2") as sock:
                assert ping(sock) == 4242
            assert server.admitted == 1 and server.refused == 0
        finally:
            agent.close()


def test_two_agents_from_one_address_count_as_two() -> None:
    """Host 0 serves until every other host's agent has come: two hosts that reach it from one
    address (one machine under two names, a NAT) are two agents, or host 0 would wait forever."""
    with remote_store() as server:
        first, second = voucher(server, os.getpid()), voucher(server, os.getpid())
        try:
            assert first.connected.wait(5) and second.connected.wait(5)
            deadline = time.monotonic() + 5  # the store counts an agent once it reads its proof
            while server.agents_seen < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert server.agents_seen == 2
        finally:
            first.close()
            second.close()


def test_a_connection_before_its_agent_waits_for_the_agent() -> None:
    with remote_store() as server:
        sock = connect(server, "127.0.0.2")
        sock.sendall(MAGIC)
        time.sleep(0.3)
        agent = voucher(server, os.getpid())
        try:
            assert ping(sock, validate=False) == 4242
        finally:
            sock.close()
            agent.close()


def test_an_unvouched_or_disowned_remote_connection_is_refused() -> None:
    other = sleeper()
    try:
        with remote_store(admit_timeout=1.0) as server:
            agent = voucher(server, other.pid)  # the agent's job is not this process
            try:
                assert agent.connected.wait(5)
                with connect(server, "127.0.0.2") as sock:  # its agent says no: at once
                    sock.sendall(MAGIC)
                    started = time.monotonic()
                    assert closed_without_data(sock, 5)
                    assert time.monotonic() - started < 0.9
                with connect(server, "127.0.0.3") as sock:  # no agent there: after the bound
                    sock.sendall(MAGIC)
                    started = time.monotonic()
                    assert closed_without_data(sock, 5)
                    assert 0.8 < time.monotonic() - started < 3
                assert server.refused == 2 and server.admitted == 0
            finally:
                agent.close()
    finally:
        other.kill()
        other.wait()


def test_a_forged_vouch_is_refused_both_ways() -> None:
    lost: list[str] = []
    with remote_store(admit_timeout=1.0) as server:
        agent = voucher(server, os.getpid(), secret=b"x" * 32, lost=lost)
        try:
            with connect(server, "127.0.0.2") as sock:
                sock.sendall(MAGIC)
                assert closed_without_data(sock, 5)
            assert not agent.connected.is_set()
            assert any("did not prove" in why for why in lost), lost  # the agent sees it too
            assert server.admitted == 0
        finally:
            agent.close()


def handshake(server: cs.C10dStoreServer, client_nonce: bytes, proof: bytes | None = None,
              ) -> tuple[socket.socket, bytes]:
    sock = connect(server, "127.0.0.2")
    sock.sendall(cs.C10D_CONTROL_MAGIC + client_nonce)
    reply = recv_exact(sock, cs.C10D_NONCE + cs.C10D_MAC)
    server_nonce = reply[:cs.C10D_NONCE]
    assert reply[cs.C10D_NONCE:] == cs.c10d_mac(SECRET, b"dtlaunch-c10d store", client_nonce,
                                                server_nonce)
    sock.sendall(proof if proof is not None else
                 cs.c10d_mac(SECRET, b"dtlaunch-c10d agent", server_nonce, client_nonce))
    return sock, server_nonce


def test_a_replayed_handshake_is_refused() -> None:
    with remote_store() as server:
        nonce = os.urandom(cs.C10D_NONCE)
        first, server_nonce = handshake(server, nonce)
        with first:
            assert not closed_without_data(first, 0.5)  # the genuine one stays
            recorded = cs.c10d_mac(SECRET, b"dtlaunch-c10d agent", server_nonce, nonce)
            replay, second_nonce = handshake(server, nonce, proof=recorded)
            with replay:
                assert second_nonce != server_nonce  # the store's challenge is fresh
                assert closed_without_data(replay, 5)
        assert server.refused == 1


def test_a_control_frame_not_signed_by_the_session_ends_it() -> None:
    with remote_store() as server:
        sock, _ = handshake(server, os.urandom(cs.C10D_NONCE))
        with sock:
            payload = json.dumps({"a": 1, "yes": True}).encode()
            sock.sendall(struct.pack("<I", len(payload)) + payload + b"\0" * cs.C10D_MAC)
            assert closed_without_data(sock, 5)


# --- bounds -------------------------------------------------------------------------------------


def test_a_slow_byte_client_is_dropped_and_blocks_no_one() -> None:
    with serve(request_timeout=1.0) as server:
        slow, fast, idle = connect(server), connect(server), connect(server)
        with slow, fast, idle:
            assert ping(idle) == 4242  # admitted, then idle between requests: kept
            request = MAGIC + bytes([cs.C10D_SET]) + key(b"k") + key(b"v" * 50)
            dropped = threading.Event()

            def dribble() -> None:
                for byte in request:
                    try:
                        slow.send(bytes([byte]))
                    except OSError:
                        dropped.set()
                        return
                    time.sleep(0.1)

            started = time.monotonic()
            writer = threading.Thread(target=dribble, daemon=True)
            writer.start()
            worst = 0.0
            for n in range(10):
                t0 = time.monotonic()
                assert ping(fast, n, validate=n == 0) == n
                worst = max(worst, time.monotonic() - t0)
                time.sleep(0.05)
            assert worst < 0.5
            assert closed_without_data(slow, 5)
            assert time.monotonic() - started < 3
            writer.join(10)
            assert ping(idle, 7, validate=False) == 7


def test_an_unknown_request_or_an_oversized_key_closes_the_connection() -> None:
    with serve() as server:
        with connect(server) as sock:
            assert ping(sock) == 4242
            sock.sendall(bytes([99]))
            assert closed_without_data(sock, 5)
        with connect(server) as sock:
            sock.sendall(MAGIC + bytes([cs.C10D_SET]) + struct.pack("<Q", cs.C10D_MAX_KEY + 1))
            assert closed_without_data(sock, 5)
        with connect(server) as sock:  # the first request must be VALIDATE with the magic
            sock.sendall(struct.pack("<BI", cs.C10D_VALIDATE, 1234))
            assert closed_without_data(sock, 5)


def test_queued_items_leave_the_stores_size_as_they_are_popped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A queue pushed and popped for a long job never fills the store: its key and its items
    leave the count with the last item (they used to leave the key's bytes behind each time)."""
    monkeypatch.setattr(cs, "C10D_MAX_STORE_BYTES", 4096)
    name, item = b"q" * 1000, b"v" * 1000
    push = bytes([cs.C10D_QUEUE_PUSH]) + key(name) + key(item)
    pop = bytes([cs.C10D_QUEUE_POP]) + key(name)
    with serve() as server, connect(server) as sock:
        sock.sendall(MAGIC)
        for _ in range(10):
            sock.sendall(push + pop)
            sock.settimeout(5)
            assert struct.unpack("<q", recv_exact(sock, 8))[0] == 1
            assert recv_exact(sock, 8 + len(item)) == key(item)
        assert ping(sock, validate=False) == 4242
        raw_set(server, b"k", b"x" * 3000)  # room for 3000 bytes is left: nothing leaked
    with serve() as server, connect(server) as sock:  # and the bound itself holds
        sock.sendall(MAGIC + push + push + push + push + push)
        assert closed_without_data(sock, 5)


def test_the_connection_limit() -> None:
    with serve(max_connections=2) as server:
        a, b = connect(server), connect(server)
        with a, b:
            assert ping(a) == 4242 and ping(b) == 4242
            with connect(server) as c:
                assert closed_without_data(c, 5)


def test_wait_is_woken_or_cancelled_as_torchs_client_expects() -> None:
    wait_k = bytes([cs.C10D_WAIT]) + struct.pack("<Q", 1) + key(b"k")
    with serve() as server, connect(server) as sock:
        sock.sendall(MAGIC + wait_k)
        assert not closed_without_data(sock, 0.3)  # nothing yet
        sock.settimeout(5)
        sock.sendall(bytes([cs.C10D_CANCEL_WAIT]))
        assert recv_exact(sock, 1) == bytes([cs.C10D_WAIT_CANCELED])
        sock.sendall(wait_k)
        raw_set(server, b"k", b"v")
        assert recv_exact(sock, 1) == bytes([cs.C10D_STOP_WAITING])
        sock.sendall(bytes([cs.C10D_CANCEL_WAIT]))  # a cancel that crossed the wake-up
        assert recv_exact(sock, 1) == bytes([cs.C10D_WAIT_CANCELED])


def test_close_ends_every_connection_promptly() -> None:
    with serve() as server:
        sock = connect(server)
        with sock:
            assert ping(sock) == 4242
            started = time.monotonic()
            server.close()
            assert time.monotonic() - started < 2
            assert closed_without_data(sock, 2)


def test_one_address_cannot_fill_the_store_with_unadmitted_connections() -> None:
    with remote_store(max_connections=cs.C10D_MAX_PENDING_PER_ADDRESS + 8) as server:
        held = [connect(server, "127.0.0.3") for _ in range(cs.C10D_MAX_PENDING_PER_ADDRESS)]
        try:
            with connect(server, "127.0.0.3") as extra:
                assert closed_without_data(extra, 5)
            agent = voucher(server, os.getpid())
            try:
                with connect(server, "127.0.0.2") as sock:  # another host still gets in
                    assert ping(sock) == 4242
            finally:
                agent.close()
        finally:
            for sock in held:
                sock.close()
