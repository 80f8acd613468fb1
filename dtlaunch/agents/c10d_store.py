"""The job's c10d store: a TCPStore server that serves the job's processes and no one else.

`torch.distributed` ranks started with `TORCHELASTIC_USE_AGENT_STORE=True` connect as TCPStore
clients to MASTER_ADDR:MASTER_PORT. PyTorch's own TCPStore server takes anyone who connects
(no authentication, and since 2.4 on every interface), so host 0's agent serves the store
itself, here, speaking the same wire protocol (c10d's QueryType requests, little-endian
integers, u64-length-prefixed keys and values) to the unmodified torch client.

Every accepted connection is admitted before any of its requests is read:
- a peer on this host: the connecting socket (found by its exact 4-tuple in /proc/net/tcp or
  tcp6) must have a non-zero inode that is open in one of the job's processes (their
  /proc/PID/fd links); never by uid (a socket closed at once shows uid 0 and inode 0);
- a peer on another host: the job's agent on that host must vouch for it. Each such agent
  holds one control connection to the store's port, told apart by its first bytes (a TCPStore
  client's first byte is VALIDATE, 0), authenticated both ways by HMAC-SHA256 challenge and
  response with the job's secret (fresh nonces each way, so nothing replays), then each frame
  MAC'd with a session key and a sequence number. The store asks "is (ip, port) -> (store ip,
  store port) yours?"; the agent answers after the same /proc check against its own processes.
  Only the first byte of a remote connection is looked at (MSG_PEEK, left in the stream) to
  tell a control connection from a client; no request is parsed before admission.

One thread runs a selector loop: requests are parsed whole as their bytes arrive, each bounded
(key and value sizes, a request's total size, the time from its first byte to its last), with
a limit on connections and on the store's total size. `close()` ends everything promptly.

Standard library only, no dtlaunch imports, Python >= 3.7 (the ranks' interpreter). Shipped
in one text with the torch host agent, after gloo_host's (whose /proc walk it uses):
module-level names carry a c10d prefix, and importing this module does nothing.
"""

from __future__ import annotations  # no annotation is evaluated at run time

import collections
import contextlib
import hashlib
import hmac
import ipaddress
import json
import os
import selectors
import socket
import struct
import threading
import time

TYPE_CHECKING = False  # the checkers' name for it: the typing module is never imported here
if TYPE_CHECKING:
    from typing import Callable, Deque, Dict, List, Optional, Set, Tuple
if TYPE_CHECKING or __name__ != "dtlaunch_torch_host":
    # Shipped, this text follows gloo_host's in one module (agents.JOINED); imported as a
    # module (tests, the checkers), it takes its names from its package.
    from .gloo_host import descendants, holders, socket_inode

# c10d's wire words (torch/csrc/distributed/c10d/TCPStoreBackend.hpp).
C10D_VALIDATION_MAGIC = 0x3C85F7CE
(C10D_VALIDATE, C10D_SET, C10D_COMPARE_SET, C10D_GET, C10D_ADD, C10D_CHECK, C10D_WAIT,
 C10D_GETNUMKEYS, C10D_DELETE_KEY, C10D_APPEND, C10D_MULTI_GET, C10D_MULTI_SET,
 C10D_CANCEL_WAIT, C10D_PING, C10D_QUEUE_PUSH, C10D_QUEUE_POP, C10D_QUEUE_LEN,
 C10D_LIST_KEYS, C10D_BARRIER) = range(19)
C10D_READY, C10D_NOT_READY = 0, 1  # CHECK's answer
C10D_STOP_WAITING, C10D_WAIT_CANCELED = 0, 1  # WAIT's and CANCEL_WAIT's answers

# The bounds (PyTorch's libuv store takes keys up to 8 KiB and values up to 8 MiB).
C10D_MAX_KEY = 8 * 1024
C10D_MAX_VALUE = 8 * 1024 * 1024
C10D_MAX_KEYS_PER_REQUEST = 128 * 1024
C10D_MAX_REQUEST = 16 * 1024 * 1024  # one request, all its parts
C10D_MAX_STORE_BYTES = 256 * 1024 * 1024  # keys, values and queued items together
C10D_MAX_CONNECTIONS = 1024
C10D_MAX_PENDING_PER_ADDRESS = 64  # not yet admitted, from one address: no host fills the rest
C10D_REQUEST_TIMEOUT = 30.0  # seconds from a request's first byte to its last
C10D_ADMIT_TIMEOUT = 30.0  # seconds a connection may wait to be admitted
C10D_MAX_OUTBOX = 32 * 1024 * 1024  # answers not yet taken: stop reading that client

# The agents' control connection.
C10D_CONTROL_MAGIC = b"DTLC10D1"  # first byte 'D', never VALIDATE's 0
C10D_NONCE = 32
C10D_MAC = 32
C10D_MAX_FRAME = 4096


# --- the job's sockets, from /proc ------------------------------------------------------------


def _c10d_norm_ip(ip: str) -> str:
    """One spelling per address: IPv4-mapped IPv6 as IPv4, IPv6 compressed, no zone."""
    addr = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


def c10d_job_owns(root: int, local: Tuple[str, int], remote: Tuple[str, int]) -> bool:
    """Whether the socket here from `local` to `remote` (addresses as _c10d_norm_ip spells
    them) is open in `root` or a process below it, read afresh on each look (a rank started
    after the store still counts). Inode 0 (no such socket, or one closed already) never is."""
    inode = socket_inode(local, remote)
    return inode > 0 and next(iter(holders(descendants(root), inode)), None) is not None


def c10d_is_local(ip: str) -> bool:
    """Whether `ip` is this host's: loopback, or one of its addresses (IPv4 from
    /proc/net/fib_trie's LOCAL routes, IPv6 from /proc/net/if_inet6)."""
    addr = ipaddress.ip_address(_c10d_norm_ip(ip))
    if addr.is_loopback:
        return True
    try:
        if addr.version == 6:
            with open("/proc/net/if_inet6") as handle:
                return any(line.split()[:1] == [addr.packed.hex()] for line in handle)
        with open("/proc/net/fib_trie") as handle:
            last = None
            for line in handle:
                words = line.split()
                if len(words) == 2 and words[0] == "|--":
                    last = words[1]
                elif last == str(addr) and "/32 host LOCAL" in line:
                    return True
    except OSError:
        pass
    return False


# --- the control connection: both sides ---------------------------------------------------------


def c10d_mac(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 over `parts`, each length-prefixed (no two part lists sign alike)."""
    text = b"".join(struct.pack("<I", len(p)) + p for p in parts)
    return hmac.new(key, text, hashlib.sha256).digest()


def _c10d_proofs(secret: bytes, client_nonce: bytes, server_nonce: bytes,
                 ) -> Tuple[bytes, bytes, bytes]:
    """The store's proof that it knows the job's secret, the agent's, and their session key."""
    return (c10d_mac(secret, b"dtlaunch-c10d store", client_nonce, server_nonce),
            c10d_mac(secret, b"dtlaunch-c10d agent", server_nonce, client_nonce),
            c10d_mac(secret, b"dtlaunch-c10d session", client_nonce, server_nonce))


def _c10d_frame(key: bytes, direction: bytes, seq: int, payload: bytes) -> bytes:
    tag = c10d_mac(key, direction, struct.pack("<Q", seq), payload)
    return struct.pack("<I", len(payload)) + payload + tag


class C10dFrameError(Exception):
    """A control frame that is malformed, too large, or not signed by the session."""


def _c10d_unframe(buf: bytearray, key: bytes, direction: bytes, seq: int) -> Optional[bytes]:
    """The payload of the first whole frame in `buf`, taken from it; None if not all there."""
    if len(buf) < 4:
        return None
    (size,) = struct.unpack_from("<I", buf, 0)
    if size > C10D_MAX_FRAME:
        raise C10dFrameError("control frame too large")
    if len(buf) < 4 + size + C10D_MAC:
        return None
    payload = bytes(buf[4:4 + size])
    tag = bytes(buf[4 + size:4 + size + C10D_MAC])
    if not hmac.compare_digest(tag, c10d_mac(key, direction, struct.pack("<Q", seq), payload)):
        raise C10dFrameError("control frame not signed by the session")
    del buf[:4 + size + C10D_MAC]
    return payload


_C10D_TO_AGENT, _C10D_TO_STORE = b"store->agent", b"agent->store"


# --- the store ----------------------------------------------------------------------------------


class _C10dIncomplete(Exception):
    """The request's bytes are not all there yet."""

    def __init__(self, need: int) -> None:
        Exception.__init__(self, need)
        self.need = need  # at least this many bytes in all


class C10dProtocolError(Exception):
    """A request the store does not take (unknown type, over a bound): its connection ends."""


class _C10dReader:
    """Reads one request's parts from a buffer; raises _C10dIncomplete when it runs out."""

    def __init__(self, buf: bytearray) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise _C10dIncomplete(end)
        data = bytes(self.buf[self.pos:end])
        self.pos = end
        return data

    def num(self, fmt: str) -> int:  # "<I" (u32), "<Q" (u64) or "<q" (i64)
        return int(struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0])

    def _size(self, limit: int, what: str) -> int:
        n = self.num("<Q")
        if n > limit:
            raise C10dProtocolError(what)
        return n

    def count(self) -> int:
        return self._size(C10D_MAX_KEYS_PER_REQUEST, "too many keys in one request")

    def key(self) -> bytes:
        return self.take(self._size(C10D_MAX_KEY, "key too long"))

    def value(self) -> bytes:
        return self.take(self._size(C10D_MAX_VALUE, "value too large"))


def _c10d_vec(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def _c10d_i64(n: int) -> bytes:
    return struct.pack("<q", n)


# A connection's phases; those before _C10D_CONTROL are not admitted yet.
_C10D_PEEK, _C10D_VOUCH, _C10D_HANDSHAKE, _C10D_CONTROL, _C10D_CLIENT = range(5)


class _C10dConn:
    __slots__ = ("asked", "closing", "deadline", "here", "inbox", "key", "outbox", "peer",
                 "pending", "phase", "proof", "seq_in", "seq_out", "sock", "validated", "waiting")

    def __init__(self, sock: socket.socket, peer: Tuple[str, int], here: Tuple[str, int]) -> None:
        self.sock, self.peer, self.here = sock, peer, here
        self.phase = _C10D_PEEK
        self.inbox, self.outbox = bytearray(), bytearray()
        self.deadline: Optional[float] = None
        self.validated = self.closing = False
        self.waiting: Set[bytes] = set()
        self.proof = b""  # a control connection's: the agent's proof it expects
        self.key = b""  # a control connection's session key, once it has sent its challenge
        self.seq_in = self.seq_out = 0  # a control connection's frames, each way
        self.asked: Set[_C10dConn] = set()  # a client: the control connections asked
        self.pending: Set[int] = set()  # a client: the questions not yet answered


class C10dStoreServer:
    """A TCPStore server on `listener` (bound and listening; the caller holds the port).

    The job's processes are `root` and those below it. Each accepted connection is decided
    before any byte is read: from this host (`is_local`), served if its socket is open in one
    of them, else closed; from another host, served once the job's agent there vouches for it
    (control connections authenticated with `secret`). `root` None serves every peer (tests,
    and torch's own behaviour)."""

    def __init__(self, listener: socket.socket, secret: bytes, root: Optional[int] = None,
                 is_local: Callable[[str], bool] = c10d_is_local,
                 admit_timeout: float = C10D_ADMIT_TIMEOUT,
                 request_timeout: float = C10D_REQUEST_TIMEOUT,
                 max_connections: int = C10D_MAX_CONNECTIONS) -> None:
        if len(secret) < 16:
            raise ValueError("the job's secret is too short")
        self._listener = listener
        here = listener.getsockname()
        self.address: Tuple[str, int] = (here[0], here[1])
        self._root = root
        self._is_local = is_local
        self._secret = secret
        self._admit_timeout = admit_timeout
        self._request_timeout = request_timeout
        self._max_connections = max_connections
        self._data: Dict[bytes, bytes] = {}
        self._queues: Dict[bytes, Deque[bytes]] = {}
        self._size = 0
        self._waiters: Dict[bytes, List[_C10dConn]] = {}
        self._conns: Dict[int, _C10dConn] = {}
        self._controls: Set[_C10dConn] = set()
        self._questions: Dict[int, _C10dConn] = {}  # a question's id: whom it is about
        self._next_question = 1
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.refused = self.admitted = 0  # connections closed unadmitted, and served (tests)
        # Other hosts' agents that proved they know the secret, counted by handshake, not by
        # address: two hosts may reach this one from one address (one machine under two
        # names, a NAT). An agent that reconnects after a lost link counts again.
        self.agents_seen = 0

    # --- life ---

    @property
    def connections(self) -> int:
        """Connections open now: the clients' and the agents' control connections (host 0's
        agent serves until the other hosts' are gone)."""
        return len(self._conns)

    def start(self) -> C10dStoreServer:
        for s in (self._listener, self._wake_r):
            s.setblocking(False)
            self._sel.register(s, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._loop, name="c10d-store", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Ends the loop, every connection and the listener; returns within `timeout`."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread is not None:
            self._thread.join(timeout)
        for c in list(self._conns.values()):
            self._drop(c)
        for s in (self._listener, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                s.close()
        with contextlib.suppress(OSError, ValueError):
            self._sel.close()

    # --- the loop ---

    def _loop(self) -> None:
        while not self._stop.is_set():
            soonest = min((c.deadline for c in self._conns.values() if c.deadline is not None),
                          default=None)
            timeout = None if soonest is None else max(0.0, soonest - time.monotonic()) + 0.001
            try:
                events = self._sel.select(timeout)
            except (OSError, ValueError):
                if self._stop.is_set():
                    return
                raise
            for sk, mask in events:
                c: Optional[_C10dConn] = sk.data  # None: the listener, or close()'s wake-up
                if sk.fileobj is self._listener:
                    self._accept()
                elif c is not None and not c.closing and c.sock.fileno() >= 0:
                    if mask & selectors.EVENT_WRITE:
                        self._flush(c)
                    if mask & selectors.EVENT_READ and not c.closing:
                        self._readable(c)
            now = time.monotonic()
            for c in [c for c in self._conns.values() if c.deadline and now >= c.deadline]:
                self._drop(c, refused=c.phase < _C10D_CONTROL)

    def _accept(self) -> None:
        for _ in range(64):  # a burst, then back to the others
            try:
                sock, addr = self._listener.accept()
            except OSError:  # none left (BlockingIOError), or the listener closed
                return
            verdict: Optional[bool] = False
            if len(self._conns) < self._max_connections:
                with contextlib.suppress(OSError, ValueError):
                    peer = (_c10d_norm_ip(addr[0]), int(addr[1]))
                    here_raw = sock.getsockname()
                    here = (_c10d_norm_ip(here_raw[0]), int(here_raw[1]))
                    if self._root is None:
                        verdict = True
                    elif self._is_local(peer[0]):
                        verdict = c10d_job_owns(self._root, peer, here)
                    else:
                        verdict = None  # another host's: its agent vouches for it, or no one
            if verdict is None and sum(1 for o in self._conns.values() if o.phase < _C10D_CONTROL
                                       and o.peer[0] == peer[0]) >= C10D_MAX_PENDING_PER_ADDRESS:
                verdict = False  # one address does not fill the store with unadmitted ones
            if verdict is False:
                self.refused += 1
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c = _C10dConn(sock, peer, here)
            self._conns[sock.fileno()] = c
            if verdict:
                self._admitted(c)
            else:
                c.deadline = time.monotonic() + self._admit_timeout
                self._sel.register(sock, selectors.EVENT_READ, c)

    def _admitted(self, c: _C10dConn) -> None:
        self.admitted += 1
        c.phase = _C10D_CLIENT
        c.deadline = None
        self._events(c)

    def _events(self, c: _C10dConn) -> None:
        if c.closing:
            return
        reading = c.phase != _C10D_VOUCH and len(c.outbox) < C10D_MAX_OUTBOX
        events = (selectors.EVENT_READ if reading else 0) | (
            selectors.EVENT_WRITE if c.outbox else 0)
        try:
            if events:
                self._sel.modify(c.sock, events, c)
            else:
                self._sel.unregister(c.sock)
        except KeyError:
            if events:
                self._sel.register(c.sock, events, c)
        except (OSError, ValueError):
            pass

    def _drop(self, c: _C10dConn, refused: bool = False) -> None:
        if c.closing:
            return
        c.closing = True
        if refused:
            self.refused += 1
        self._clear_wait(c)
        self._conns.pop(c.sock.fileno(), None)
        self._controls.discard(c)
        for qid in c.pending:
            self._questions.pop(qid, None)
        with contextlib.suppress(KeyError, OSError, ValueError):
            self._sel.unregister(c.sock)
        with contextlib.suppress(OSError):
            c.sock.close()

    def _send(self, c: _C10dConn, data: bytes) -> None:
        if c.closing:
            return
        c.outbox += data
        self._flush(c)

    def _flush(self, c: _C10dConn) -> None:
        while c.outbox:
            try:
                n = c.sock.send(c.outbox)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._drop(c)
                return
            del c.outbox[:n]
        self._events(c)

    def _readable(self, c: _C10dConn) -> None:
        if c.phase == _C10D_PEEK:
            self._peek(c)
            return
        try:
            data = c.sock.recv(262144)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(c)
            return
        if not data:
            self._drop(c, refused=c.phase < _C10D_CONTROL)
            return
        if not c.inbox and c.phase == _C10D_CLIENT:
            c.deadline = time.monotonic() + self._request_timeout  # a request starts
        c.inbox += data
        if c.phase == _C10D_CLIENT:
            self._serve(c)
        elif c.phase == _C10D_HANDSHAKE:
            self._handshake(c)
        elif c.phase == _C10D_CONTROL:
            self._control(c)

    # --- admission of another host's peers ---

    def _peek(self, c: _C10dConn) -> None:
        try:
            first = c.sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            first = b""
        if not first:
            self._drop(c, refused=True)
        elif first == C10D_CONTROL_MAGIC[:1]:
            c.phase = _C10D_HANDSHAKE  # the deadline runs on: the whole handshake is bounded
        else:
            c.phase = _C10D_VOUCH
            self._events(c)  # read nothing more until it is vouched for
            self._ask(c)

    def _ask(self, c: _C10dConn) -> None:
        """Asks each control connection from the peer's address whether `c` is its job's."""
        for control in list(self._controls):
            if control.peer[0] != c.peer[0] or control in c.asked:
                continue
            c.asked.add(control)
            qid = self._next_question
            self._next_question += 1
            self._questions[qid] = c
            c.pending.add(qid)
            body = json.dumps({"q": qid, "peer": list(c.peer), "store": list(c.here)})
            self._send(control, _c10d_frame(control.key, _C10D_TO_AGENT, control.seq_out,
                                            body.encode("utf-8")))
            control.seq_out += 1

    def _handshake(self, c: _C10dConn) -> None:
        need = len(C10D_CONTROL_MAGIC) + C10D_NONCE
        if not c.key:
            if len(c.inbox) < need:
                return
            if bytes(c.inbox[:len(C10D_CONTROL_MAGIC)]) != C10D_CONTROL_MAGIC:
                self._drop(c, refused=True)
                return
            client_nonce = bytes(c.inbox[len(C10D_CONTROL_MAGIC):need])
            del c.inbox[:need]
            server_nonce = os.urandom(C10D_NONCE)
            ours, c.proof, c.key = _c10d_proofs(self._secret, client_nonce, server_nonce)
            self._send(c, server_nonce + ours)
        if len(c.inbox) < C10D_MAC:
            return
        proof = bytes(c.inbox[:C10D_MAC])
        del c.inbox[:C10D_MAC]
        if not hmac.compare_digest(proof, c.proof):
            self._drop(c, refused=True)  # the agent does not know the job's secret
            return
        c.phase = _C10D_CONTROL
        self.agents_seen += 1
        c.deadline = None
        self._controls.add(c)
        for waiting in list(self._conns.values()):
            if waiting.phase == _C10D_VOUCH and waiting.peer[0] == c.peer[0]:
                self._ask(waiting)
        if c.inbox:
            self._control(c)

    def _control(self, c: _C10dConn) -> None:
        while not c.closing:
            try:
                payload = _c10d_unframe(c.inbox, c.key, _C10D_TO_STORE, c.seq_in)
                if payload is None:
                    return
                c.seq_in += 1
                message = json.loads(payload.decode("utf-8"))
                qid, yes = int(message["a"]), message["yes"] is True
            except (C10dFrameError, ValueError, KeyError, TypeError):
                self._drop(c)
                return
            asked = self._questions.pop(qid, None)
            if asked is None or asked.closing or asked.phase != _C10D_VOUCH:
                continue
            asked.pending.discard(qid)
            if yes:
                self._admitted(asked)  # questions still out are dropped as they are answered
            elif not asked.pending:
                self._drop(asked, refused=True)  # no agent of the job vouched for it

    # --- the TCPStore protocol ---

    def _serve(self, c: _C10dConn) -> None:
        while c.inbox and not c.closing:
            if len(c.outbox) >= C10D_MAX_OUTBOX:
                self._events(c)  # stop reading until the client takes its answers
                return
            reader = _C10dReader(c.inbox)
            try:
                answer = self._request(c, reader)
            except _C10dIncomplete as more:
                if more.need > C10D_MAX_REQUEST:
                    self._drop(c)
                return
            except (C10dProtocolError, ValueError):
                self._drop(c)
                return
            del c.inbox[:reader.pos]
            c.deadline = time.monotonic() + self._request_timeout if c.inbox else None
            if answer:
                self._send(c, answer)

    def _request(self, c: _C10dConn, r: _C10dReader) -> bytes:
        """One whole request's answer (b"" for none); changes nothing until it is whole."""
        kind = r.take(1)[0]
        if not c.validated:
            if kind != C10D_VALIDATE or r.num("<I") != C10D_VALIDATION_MAGIC:
                raise C10dProtocolError("the first request is not VALIDATE with c10d's magic")
            c.validated = True
            return b""
        if kind == C10D_PING:
            return struct.pack("<I", r.num("<I"))
        if kind == C10D_SET:
            self._set(r.key(), r.value())
            return b""
        if kind == C10D_COMPARE_SET:
            key, expected, desired = r.key(), r.value(), r.value()
            current = self._data.get(key)
            if current is None and expected:
                self._wake(key)
                return _c10d_vec(expected)
            if current is None or current == expected:
                self._set(key, desired)
            else:
                self._wake(key)
            return _c10d_vec(self._data[key])
        if kind == C10D_GET:
            return _c10d_vec(self._data.get(r.key(), b""))
        if kind == C10D_ADD:
            return _c10d_i64(self._add(r.key(), r.num("<q")))
        if kind == C10D_CHECK:
            keys = [r.key() for _ in range(r.count())]
            return bytes([C10D_READY if self._present(keys) else C10D_NOT_READY])
        if kind == C10D_WAIT:
            keys = [r.key() for _ in range(r.count())]
            return self._wait_for(c, [key for key in keys if not self._present([key])])
        if kind == C10D_GETNUMKEYS:
            return _c10d_i64(len(self._data))
        if kind == C10D_DELETE_KEY:
            key = r.key()
            if key not in self._data:
                return _c10d_i64(0)
            self._size -= len(key) + len(self._data.pop(key))
            return _c10d_i64(1)
        if kind == C10D_APPEND:
            key, value = r.key(), r.value()
            self._set(key, self._data.get(key, b"") + value)
            return b""
        if kind == C10D_MULTI_GET:
            keys = [r.key() for _ in range(r.count())]
            return b"".join(_c10d_vec(self._data.get(key, b"")) for key in keys)
        if kind == C10D_MULTI_SET:
            for key, value in [(r.key(), r.value()) for _ in range(r.count())]:
                self._set(key, value)  # once the request is whole
            return b""
        if kind == C10D_CANCEL_WAIT:
            self._clear_wait(c)
            return bytes([C10D_WAIT_CANCELED])
        if kind == C10D_QUEUE_PUSH:
            key, value = r.key(), r.value()
            # A queue's key counts once, while the queue holds anything (POP takes it off).
            self._grow(len(value) + (0 if key in self._queues else len(key)))
            self._queues.setdefault(key, collections.deque()).append(value)
            self._wake(key, one=True)
            return b""
        if kind == C10D_QUEUE_POP:
            key = r.key()
            queue = self._queues.get(key)
            if not queue:
                return _c10d_i64(0)
            value = queue.popleft()
            self._size -= len(value)
            if not queue:
                del self._queues[key]
                self._size -= len(key)
            return _c10d_i64(len(queue) + 1) + _c10d_vec(value)
        if kind == C10D_QUEUE_LEN:
            return _c10d_i64(len(self._queues.get(r.key(), ())))
        if kind == C10D_LIST_KEYS:
            return _c10d_i64(len(self._data)) + b"".join(_c10d_vec(k) for k in self._data)
        if kind == C10D_BARRIER:
            key, world = r.key(), r.num("<q")
            count = self._add(key, 1)  # wakes the ones waiting
            return self._wait_for(c, [key] if count < world else [])
        raise C10dProtocolError(f"unknown request type {kind}")

    def _add(self, key: bytes, delta: int) -> int:
        try:
            total = int(self._data.get(key, b"0").decode("ascii").strip()) + delta
        except (UnicodeDecodeError, ValueError):
            raise C10dProtocolError("ADD on a value that is not a number") from None
        self._set(key, str(total).encode("ascii"))
        return total

    def _present(self, keys: List[bytes]) -> bool:
        return all(k in self._data or k in self._queues for k in keys)  # no queue is kept empty

    def _grow(self, n: int) -> None:
        if self._size + n > C10D_MAX_STORE_BYTES:
            raise C10dProtocolError("the store is full")
        self._size += n

    def _set(self, key: bytes, value: bytes) -> None:
        old = self._data.get(key)
        old_size = 0 if old is None else len(key) + len(old)
        self._grow(len(key) + len(value) - old_size)
        self._data[key] = value
        self._wake(key)

    def _wake(self, key: bytes, one: bool = False) -> None:
        waiting = self._waiters.get(key, [])
        for c in list(waiting):
            waiting.remove(c)
            c.waiting.discard(key)
            if not c.waiting:
                self._send(c, bytes([C10D_STOP_WAITING]))
                if one:
                    break
        if not waiting:
            self._waiters.pop(key, None)

    def _wait_for(self, c: _C10dConn, keys: List[bytes]) -> bytes:
        """STOP_WAITING now if `keys` is empty, else nothing: `c` is answered once each of them
        has been set (any earlier wait of its ends)."""
        if not keys:
            return bytes([C10D_STOP_WAITING])
        self._clear_wait(c)
        for key in keys:
            c.waiting.add(key)
            self._waiters.setdefault(key, []).append(c)
        return b""

    def _clear_wait(self, c: _C10dConn) -> None:
        for key in c.waiting:
            waiting = self._waiters.get(key)
            if waiting and c in waiting:
                waiting.remove(c)
                if not waiting:
                    del self._waiters[key]
        c.waiting = set()


# --- the agent on another host: vouches for its job's sockets ---------------------------------


class C10dVoucher:
    """The job's agent on another host: holds the control connection to the store at `store`,
    proves it knows `secret` (and checks the store does), then answers each "is this socket
    yours?": yes when it is open in `root` or a process below it.
    Reconnects after a loss until closed; `on_lost(reason)` hears each loss, `connected` is set
    while it has one."""

    def __init__(self, store: Tuple[str, int], secret: bytes, root: int,
                 timeout: float = C10D_REQUEST_TIMEOUT,
                 retry: float = 1.0,
                 on_lost: Callable[[str], None] = lambda reason: None,
                 source: Optional[Tuple[str, int]] = None) -> None:
        self.store = store
        self._source = source  # the address to connect from (this host's on the job's network)
        self._secret = secret
        self._root = root
        self._timeout = timeout
        self._retry = retry
        self._on_lost = on_lost
        self._stop = threading.Event()
        self.connected = threading.Event()
        self._sock: Optional[socket.socket] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> C10dVoucher:
        self._thread = threading.Thread(target=self._run, name="c10d-voucher", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._session()
                reason = "the store closed the control connection"
            except (OSError, C10dFrameError, ValueError, KeyError, TypeError) as err:
                reason = f"control connection lost: {err}"
            self.connected.clear()
            if self._stop.is_set():
                return
            self._on_lost(reason)
            self._stop.wait(self._retry)

    def _session(self) -> None:
        sock = socket.create_connection(self.store, timeout=self._timeout,
                                        source_address=self._source)
        self._sock = sock
        try:
            if self._stop.is_set():
                return
            key = self._authenticate(sock)
            sock.settimeout(None)  # idle between questions; close() shuts it down
            self.connected.set()
            buf = bytearray()
            seq_in = seq_out = 0
            while not self._stop.is_set():
                payload = _c10d_unframe(buf, key, _C10D_TO_AGENT, seq_in)
                if payload is None:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buf += data
                    continue
                seq_in += 1
                question = json.loads(payload.decode("utf-8"))
                peer, store = question["peer"], question["store"]
                try:
                    yes = c10d_job_owns(self._root, (str(peer[0]), int(peer[1])),
                                        (str(store[0]), int(store[1])))
                except (OSError, ValueError):
                    yes = False
                answer = json.dumps({"a": int(question["q"]), "yes": yes}).encode("utf-8")
                sock.sendall(_c10d_frame(key, _C10D_TO_STORE, seq_out, answer))
                seq_out += 1
        finally:
            self._sock = None
            sock.close()

    def _authenticate(self, sock: socket.socket) -> bytes:
        deadline = time.monotonic() + self._timeout
        client_nonce = os.urandom(C10D_NONCE)
        sock.sendall(C10D_CONTROL_MAGIC + client_nonce)
        reply = b""
        while len(reply) < C10D_NONCE + C10D_MAC:  # the whole handshake within the timeout
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("timed out")
            sock.settimeout(left)
            data = sock.recv(C10D_NONCE + C10D_MAC - len(reply))
            if not data:
                raise ConnectionError("closed during the handshake")
            reply += data
        store, agent, key = _c10d_proofs(self._secret, client_nonce, reply[:C10D_NONCE])
        if not hmac.compare_digest(reply[C10D_NONCE:], store):
            raise C10dFrameError("the store did not prove it knows the job's secret")
        sock.sendall(agent)
        return key
