"""The Gloo job's rendezvous store: a key-value store by scope (GET, PUT, DELETE on
/SCOPE/KEY) that lives as long as the job and serves only the job's host agents.

- It listens on the job's own addresses only (never 0.0.0.0), chosen by the caller.
- Every request carries a fresh nonce and an HMAC-SHA256 signature made with the job's secret
  (dtlaunch.agents.gloo_host signs for the ranks, which speak plain HTTP to it on their host);
  an unsigned, wrongly signed or replayed request gets 401 and changes nothing. Each answer is
  signed back, so nobody on the network can feed a rank a forged address either.
- Values are bytes kept as bytes: nothing is ever decoded, let alone unpickled.
- Bounded: the request head, the body (the agents' MAX_BODY), the keys per scope, the connections served
  at once (those of addresses not yet proven by a signed request apart, and each such address
  its share: strangers holding connections open leave the job's hosts room); each whole
  request has a deadline, every read and write a timeout.

DELETE keeps horovodrun's meaning for the scopes the job's layout defines (`global`,
`local_HOST`, `cross_N`): once every member of a scope has deleted its key, the scope is
cleared (so a later rendezvous starts clean); elsewhere it deletes the key.
"""

from __future__ import annotations

import binascii
import contextlib
import errno
import hmac
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from dtlaunch import agents
from dtlaunch.agents import read_request  # its agent loaded here, never first by a serving thread
from dtlaunch.core.errors import DtlaunchError

MAX_KEYS = 100_000  # per scope; a job has a few per rank
MAX_NONCES = 1_000_000  # remembered against replays; beyond it the store refuses new requests
# A nonce may start with its sender's clock (`<unix seconds, hex>-<random>`): one older than
# NONCE_MAX_AGE by the store's clock is refused, so one remembered for NONCE_FORGET (longer)
# can be forgotten: a long elastic job's agents poll for ever without filling the memory.
# Clocks may differ by up to NONCE_FORGET - NONCE_MAX_AGE (an hour).
NONCE_MAX_AGE = 3600.0
NONCE_FORGET = 7200.0
IO_TIMEOUT = 10.0
# A whole request (head and body) has this long, however slowly its bytes come (slowloris).
REQUEST_DEADLINE = 10.0
# Connections served at once: from addresses that have sent a signed request (the job's
# hosts), and apart from them, from addresses that have not yet (a host's first requests, or
# a stranger), each such address holding at most MAX_UNPROVEN_PER_PEER: strangers holding
# connections open never take the job's.
MAX_CLIENTS = 512
MAX_UNPROVEN = 256
MAX_UNPROVEN_PER_PEER = 128
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-:")
MAX_NAME = 255


def split_path(path: bytes) -> tuple[str, str] | None:
    """`/SCOPE/KEY` with both plain names (letters, digits, `_.-:`, not starting with a dot);
    None otherwise."""
    try:
        text = path.decode("ascii")
    except UnicodeDecodeError:
        return None
    parts = text.split("/")
    if len(parts) != 3 or parts[0] or not all(
            0 < len(name) <= MAX_NAME and _NAME_CHARS.issuperset(name) and name[0] != "."
            for name in parts[1:]):
        return None
    return parts[1], parts[2]


@dataclass
class Refusal:
    peer: str
    why: str


@dataclass
class Store:
    """The job's store; `start()` binds it, `close()` ends it (and every connection)."""

    addresses: Sequence[str]
    secret: bytes = field(default_factory=lambda: os.urandom(32))  # the job's, for its agents
    scope_sizes: Mapping[str, int] = field(default_factory=dict)
    # Scopes served by someone else (an elastic job's driver): (method, key, body) -> answer.
    # They may block (a barrier, a long poll); the store's lock is not held meanwhile.
    hooks: Mapping[str, Callable[[bytes, str, bytes], tuple[int, bytes]]] = field(
        default_factory=dict)
    port: int = 0
    refusals: list[Refusal] = field(default_factory=list)
    _data: dict[str, dict[str, bytes]] = field(default_factory=dict)
    _finished: dict[str, set[str]] = field(default_factory=dict)
    _nonces: dict[bytes, float] = field(default_factory=dict)  # nonce -> when it came (or inf)
    _pruned_at: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _socks: list[socket.socket] = field(default_factory=list)
    _proven: set[str] = field(default_factory=set)  # addresses that sent a signed request
    _held: dict[str, int] = field(default_factory=dict)  # connections served, by address
    _held_unproven: dict[str, int] = field(default_factory=dict)
    _closed: bool = False

    def start(self) -> None:
        """Bind every address on one port (the first one's, picked by the kernel; picked
        again when another address has it taken)."""
        for attempt in range(5):
            try:
                self._bind(self.addresses, self.port)
                break
            except OSError as exc:
                for sock in self._socks:
                    sock.close()
                self._socks.clear()
                if self.port or exc.errno != errno.EADDRINUSE or attempt == 4:
                    raise DtlaunchError(f"--gloo: the rendezvous store cannot listen on "
                                        f"{', '.join(self.addresses)}: "
                                        f"{exc.strerror or exc}") from None

    def _bind(self, addresses: Sequence[str], port: int) -> None:
        """Every address bound on `port` (0: the kernel's pick) and served, or OSError (those
        bound before it are left in _socks, unserved, for the caller to close)."""
        before = len(self._socks)
        for address in addresses:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.bind((address, port))
            except OSError:
                sock.close()
                raise
            sock.listen(256)
            port = sock.getsockname()[1]
            self._socks.append(sock)
        self.port = port
        for sock in self._socks[before:]:
            threading.Thread(target=self._accept, args=(sock,), daemon=True,
                             name="dtlaunch-gloo-store").start()

    def listen_also(self, address: str) -> None:
        """Serve `address` too, on the same port (an elastic job's host on another route)."""
        if address in self.addresses:
            return
        self.addresses = [*self.addresses, address]
        try:
            self._bind([address], self.port)
        except OSError as exc:
            self.addresses = self.addresses[:-1]
            raise DtlaunchError(f"the rendezvous store cannot listen on {address} port "
                                f"{self.port}: {exc.strerror or exc}") from None

    def reached_at(self, address: str) -> dict[str, object]:
        """What a host's agent is told of the store: `address` (where that host reaches it),
        the port and the job's secret."""
        return {"host": address, "port": self.port,
                "secret": binascii.hexlify(self.secret).decode("ascii")}

    def close(self) -> None:
        self._closed = True
        for sock in self._socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    # --- serving ---------------------------------------------------------------------------

    def _accept(self, sock: socket.socket) -> None:
        while not self._closed:
            try:
                conn, peer = sock.accept()
            except OSError:
                return
            address = str(peer[0])
            slot = self._take_slot(address)
            if slot is None:
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, address, slot),
                             daemon=True).start()

    def _take_slot(self, address: str) -> dict[str, int] | None:
        """A place for one more connection from `address`: the count it was entered in (to
        release), or None when there is none."""
        with self._lock:
            if address in self._proven:
                counts, limit, per_peer = self._held, MAX_CLIENTS, MAX_CLIENTS
            else:
                counts, limit, per_peer = (self._held_unproven, MAX_UNPROVEN,
                                           MAX_UNPROVEN_PER_PEER)
            if sum(counts.values()) >= limit or counts.get(address, 0) >= per_peer:
                return None
            counts[address] = counts.get(address, 0) + 1
            return counts

    def _refuse(self, peer: str, why: str) -> None:
        with self._lock:
            if len(self.refusals) < 1000:
                self.refusals.append(Refusal(peer, why))

    def _serve(self, conn: socket.socket, peer: str, slot: dict[str, int]) -> None:
        try:
            conn.settimeout(IO_TIMEOUT)
            try:
                got = read_request(conn, b"", deadline=time.monotonic() + REQUEST_DEADLINE)
            except agents.BadRequest as exc:
                self._refuse(peer, str(exc))
                conn.sendall(agents.response_bytes(exc.status, close=True))
                return
            if got is None:
                return
            method, path, headers, body, _ = got
            nonce = headers.get(agents.NONCE_HEADER.lower(), "").encode("latin-1")
            mac = headers.get(agents.AUTH_HEADER.lower(), "")
            if not self._authentic(method, path, nonce, body, mac):
                self._refuse(peer, "unsigned, wrongly signed or replayed request")
                conn.sendall(agents.response_bytes(401, close=True))
                return
            with self._lock:
                self._proven.add(peer)
            status, answer = self.handle(method, path, body)
            signed = agents.response_mac(self.secret, nonce, status, answer)
            conn.sendall(agents.response_bytes(
                status, answer, headers=((agents.AUTH_HEADER, signed),), close=True))
        except (OSError, ValueError):  # the peer went away; or bytes no request has
            return
        finally:
            conn.close()
            with self._lock:  # the place _take_slot gave this connection
                slot[peer] -= 1
                if not slot[peer]:
                    del slot[peer]

    def _authentic(self, method: bytes, path: bytes, nonce: bytes, body: bytes,
                   mac: str) -> bool:
        if not 16 <= len(nonce) <= 64 or not mac:
            return False
        expected = agents.request_mac(self.secret, method, path, nonce, body)
        if not hmac.compare_digest(expected, mac):
            return False
        now = time.time()
        stamp, dash, _ = nonce.partition(b"-")
        forget_at = float("inf")  # a nonce without its time is remembered for the job's life
        if dash:
            try:
                sent = int(stamp, 16)
            except ValueError:
                return False
            if sent < now - NONCE_MAX_AGE:
                return False
            forget_at = now + NONCE_FORGET
        with self._lock:
            if now - self._pruned_at > 60:
                self._pruned_at = now
                self._nonces = {n: t for n, t in self._nonces.items() if t > now}
            if nonce in self._nonces or len(self._nonces) >= MAX_NONCES:
                return False
            self._nonces[nonce] = forget_at
        return True

    def handle(self, method: bytes, path: bytes, body: bytes) -> tuple[int, bytes]:
        """An authenticated request: (status, value)."""
        where = split_path(path)
        if where is None:
            return 400, b""
        scope, key = where
        hook = self.hooks.get(scope)
        if hook is not None:
            return hook(method, key, body)
        with self._lock:
            values = self._data.get(scope, {})
            if method == b"GET":
                value = values.get(key)
                return (404, b"") if value is None else (200, value)
            if method == b"PUT":
                if key not in values and len(values) >= MAX_KEYS:
                    return 413, b""
                self._data.setdefault(scope, {})[key] = body
                return 200, b""
            if method == b"DELETE":
                self._delete(scope, key)
                return 200, b""
        return 405, b""

    def reset_round(self, sizes: Mapping[str, int]) -> None:
        """A new rendezvous round (an elastic job's reset): Horovod's scopes start empty, with
        the new round's sizes; what the hooks serve is theirs to keep."""
        with self._lock:
            self._data.clear()
            self._finished.clear()
            self.scope_sizes = dict(sizes)

    def _delete(self, scope: str, key: str) -> None:
        size = self.scope_sizes.get(scope)
        if size is None:
            values = self._data.get(scope)
            if values is not None:
                values.pop(key, None)
                if not values:
                    del self._data[scope]
            return
        done = self._finished.setdefault(scope, set())
        done.add(key)
        if len(done) >= size:
            self._data.pop(scope, None)
            self._finished.pop(scope, None)
