"""The Gloo job's agent on one host: starts that host's ranks and is their only way to the
job's rendezvous store.

How it arrives: dtlaunch runs `python -I -S -c <BOOT>` on the host (over ssh, or here for a
local host) and sends everything on standard input, nothing on a command line: first this
file (one line of base64 of its compressed text, which BOOT executes), then one line of JSON
(the job: each local rank's variables, the rank shim's argv, the store's address and the job's
secret). Standard input then stays open for the job's life: its end (dtlaunch stopped the job,
died, or lost the link) ends every rank here; SIGTERM, SIGINT or SIGHUP do the same.

The ranks' rendezvous: Horovod's Gloo context talks plain HTTP (GET, PUT, DELETE on
/SCOPE/KEY) and sends no credentials. So each rank is pointed at a forwarder here on
127.0.0.1, which serves only the job's own processes (before any byte of a request is read,
the connecting socket, found in /proc/net/tcp by its exact four-tuple, must be open in this
agent or its descendants, as this user), bounds every request, signs it with the job's
secret (HMAC-SHA256 over the method, path, a fresh nonce and the body's digest) and passes it
to dtlaunch's store, whose signed answer it checks before the rank sees it. The secret never
leaves this process's memory (it is not in any rank's environment).

Each rank runs under the rank shim, whose records (each at most PIPE_BUF bytes, one atomic
write) go straight to this process's stdout, the ssh channel. This agent's own lines go to
stderr, prefixed `dtlaunch-gloo:`.

Standard library only, no dtlaunch imports, Python >= 3.7 (the ranks' interpreter).
"""

from __future__ import annotations  # no annotation is evaluated at run time

import binascii
import contextlib
import hashlib
import hmac
import io
import json
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

# The words the rest of dtlaunch shares with this agent (through dtlaunch.agents).
__all__ = ["AUTH_HEADER", "NONCE_HEADER", "BadRequest", "read_request", "request_mac", "response_bytes",
           "response_mac"]

TYPE_CHECKING = False  # the checkers' name for it: the typing module is never imported here
if TYPE_CHECKING:
    from typing import Any, BinaryIO, Callable, Dict, Iterable, List, NoReturn, Optional, Sequence, Tuple

PROTOCOL = b"dtlaunch-gloo-1"
NONCE_HEADER = "X-Dtlaunch-Nonce"
AUTH_HEADER = "X-Dtlaunch-Auth"
MAX_HEAD = 16 * 1024  # request line and headers
MAX_BODY = 1 << 20  # a rendezvous value (Gloo's are a few hundred bytes)
IO_TIMEOUT = 30.0  # seconds any one read or write may wait
STORE_TIMEOUT = 30.0
MAX_CLIENTS = 256  # connections served at once; more are closed at once
RANK_GRACE = 3.0  # after the ranks are told to stop, before SIGKILL of what is left
PREFIX = "dtlaunch-gloo: "


# --- both sides: the signatures -------------------------------------------------------------


def request_mac(secret: bytes, method: bytes, path: bytes, nonce: bytes, body: bytes) -> str:
    """The request's signature: bytes in, hex out."""
    text = b"\n".join((PROTOCOL, b"request", method, path, nonce,
                       hashlib.sha256(body).hexdigest().encode("ascii")))
    return hmac.new(secret, text, hashlib.sha256).hexdigest()


def response_mac(secret: bytes, nonce: bytes, status: int, body: bytes) -> str:
    text = b"\n".join((PROTOCOL, b"response", nonce, str(status).encode("ascii"),
                       hashlib.sha256(body).hexdigest().encode("ascii")))
    return hmac.new(secret, text, hashlib.sha256).hexdigest()


class BadRequest(Exception):
    def __init__(self, status: int, why: str) -> None:
        Exception.__init__(self, why)
        self.status = status


def is_number(text: str) -> bool:
    """ASCII digits only: str.isdigit() is also true of '²', which int() refuses."""
    return text.isascii() and text.isdigit()


def _recv(conn: socket.socket, size: int, deadline: Optional[float]) -> bytes:
    """conn.recv, but never past `deadline` (time.monotonic()): the whole request has that
    long, however slowly its bytes come."""
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BadRequest(408, "request not complete in time")
        conn.settimeout(min(left, IO_TIMEOUT))
    try:
        return conn.recv(size)
    except socket.timeout:
        raise BadRequest(408, "request not complete in time") from None


def read_request(conn: socket.socket, buf: bytes, deadline: Optional[float] = None,
                 status_line: bool = False,
                 ) -> Optional[Tuple[bytes, bytes, Dict[str, str], bytes, bytes]]:
    """One HTTP/1.x request from `conn` (bytes already read first in `buf`): (method, path,
    headers with lower-case names, body, what was read beyond it); with `status_line`, an
    answer (its version and status in place of method and path). None: the peer closed
    between requests. Raises BadRequest for anything malformed or too large, or not complete
    by `deadline`."""
    while b"\r\n\r\n" not in buf:
        if len(buf) > MAX_HEAD:
            raise BadRequest(431, "request head too large")
        data = _recv(conn, 65536, deadline)
        if not data:
            if buf:
                raise BadRequest(400, "request cut short")
            return None
        buf += data
    head, _, rest = buf.partition(b"\r\n\r\n")
    if len(head) > MAX_HEAD:
        raise BadRequest(431, "request head too large")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2 if status_line else -1)
    if status_line:
        if len(parts) < 2 or not is_number(parts[1].decode("latin-1")):
            raise BadRequest(502, "store answer unreadable")
    elif len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise BadRequest(400, "not an HTTP/1 request line")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise BadRequest(400, "malformed header")
        headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    if "transfer-encoding" in headers:
        raise BadRequest(501, "chunked bodies are not taken")
    length_text = headers.get("content-length", "0")
    if not is_number(length_text):
        raise BadRequest(400, "bad Content-Length")
    length = int(length_text)
    if length > MAX_BODY:
        raise BadRequest(413, "body too large")
    while len(rest) < length:
        data = _recv(conn, min(65536, length - len(rest)), deadline)
        if not data:
            raise BadRequest(400, "body cut short")
        rest += data
    return parts[0], parts[1], headers, rest[:length], rest[length:]


REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
           404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
           413: "Payload Too Large", 431: "Request Header Fields Too Large",
           501: "Not Implemented", 502: "Bad Gateway", 503: "Service Unavailable"}


def response_bytes(status: int, body: bytes = b"", headers: Sequence[Tuple[str, str]] = (),
                   close: bool = False) -> bytes:
    lines = ["HTTP/1.1 %d %s" % (status, REASONS.get(status, "Error")),
             "Content-Length: %d" % len(body)]
    lines += ["%s: %s" % pair for pair in headers]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


# --- the forwarder ---------------------------------------------------------------------------


def _proc_address(address: str, port: int, six: bool) -> str:
    """`address:port` as /proc/net/tcp or tcp6 writes it (in tcp6, IPv4 as IPv4-mapped): each
    32-bit word of the address in the host's byte order, in hex. OSError for IPv6 in tcp."""
    if six:
        packed = socket.inet_pton(socket.AF_INET6, address if ":" in address else "::ffff:" + address)
    else:
        packed = socket.inet_aton(address)
    words = struct.unpack("=%dI" % (len(packed) // 4), packed)
    return "".join("%08X" % word for word in words) + ":%04X" % port


def socket_inode(local: Tuple[str, int], remote: Tuple[str, int]) -> int:
    """The inode of this host's TCP socket bound to `local` and connected to `remote` (its
    exact four-tuple in /proc/net/tcp or tcp6; IPv6 without a zone, IPv4 never as mapped); 0
    when it is not there or its socket is closed already (FIN_WAIT2, TIME_WAIT: no process
    holds it)."""
    for table, six in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            want = [_proc_address(address, port, six) for address, port in (local, remote)]
            with open(table) as handle:
                for line in handle:
                    fields = line.split()
                    if len(fields) > 9 and fields[1:3] == want:
                        return int(fields[9])
        except (OSError, ValueError):
            continue
    return 0


def _stats() -> Iterable[Tuple[int, List[bytes]]]:
    """Each process's pid and the fields of its /proc/PID/stat after the name (which may hold
    spaces and ')'): state, parent, group, session, ..."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry, "rb") as handle:
                    stat = handle.read()
            except OSError:
                continue
            yield int(entry), stat.rsplit(b")", 1)[-1].split()


def descendants(root: int) -> List[int]:
    """`root` and every process below it now (the job's processes, from this agent down)."""
    children: Dict[int, List[int]] = {}
    for pid, fields in _stats():
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(pid)
    found = [root]
    for pid in found:  # grows as it goes: breadth first
        found.extend(children.get(pid, ()))
    return found


def process_uids(pid: int) -> Tuple[int, ...]:
    """The real, effective, saved and file-system uids of process `pid` (empty if gone)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/%d/status" % pid) as handle:
        for line in handle:
            if line.startswith("Uid:"):
                return tuple(int(v) for v in line.split()[1:])
    return ()


def holders(pids: Iterable[int], inode: int) -> Iterable[int]:
    """Those of `pids` that have the socket `inode` open."""
    target = "socket:[%d]" % inode
    for pid in pids:
        base = "/proc/%d/fd" % pid
        try:
            fds = os.listdir(base)
        except OSError:
            continue
        for fd in fds:
            try:
                held = os.readlink(base + "/" + fd) == target
            except OSError:
                continue
            if held:
                yield pid
                break


def from_own_process(peer: Tuple[str, int], own_port: int) -> bool:
    """The connection from `peer` was opened, and is still held, by this agent or one of its
    descendants: its socket's inode (0 once closed) is open in one of them, and every process
    that holds it runs as this agent's user (a descendant that became another user is that
    user's, not the job's). Not the uid of /proc/net/tcp, which a socket closed at once
    (FIN_WAIT2) reports as root's. The processes are found afresh each time (a remembered pid
    could be another user's by now)."""
    inode = socket_inode(peer, ("127.0.0.1", own_port))
    held = list(holders(descendants(os.getpid()), inode)) if inode else []
    return bool(held) and all(set(process_uids(pid)) == {os.geteuid()} for pid in held)


class Forwarder:
    """127.0.0.1:PORT for the ranks here; each request signed and passed to the store."""

    def __init__(self, store_host: str, store_port: int, secret: bytes,
                 round_timeout: float = STORE_TIMEOUT) -> None:
        self.store = (store_host, store_port)
        self.secret = secret
        # An elastic rank's GET /rank_and_size/ waits for every worker of its round.
        self.round_timeout = round_timeout
        # Elastic ranks' notification services: local rank -> (port, key), never sent on.
        self.workers: Dict[int, Tuple[int, bytes]] = {}
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.slots = threading.BoundedSemaphore(MAX_CLIENTS)
        self.closed = False

    def start(self) -> None:
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            if not self.slots.acquire(False):
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True).start()

    def _serve(self, conn: socket.socket, peer: Tuple[str, int]) -> None:
        try:
            conn.settimeout(IO_TIMEOUT)
            # Before any byte is read: only the job's own processes may speak here.
            if not from_own_process(peer, self.port):
                conn.sendall(response_bytes(403, close=True))
                return
            buf = b""
            while True:
                try:
                    got = read_request(conn, buf)
                except BadRequest as exc:
                    conn.sendall(response_bytes(exc.status, close=True))
                    return
                if got is None:
                    return
                method, path, headers, body, buf = got
                status, answer = self._from_rank(method, path, body)
                close = headers.get("connection", "").lower() == "close"
                conn.sendall(response_bytes(status, answer, close=close))
                if close:
                    return
        except (OSError, ValueError):
            return
        finally:
            conn.close()
            self.slots.release()

    def _from_rank(self, method: bytes, path: bytes, body: bytes) -> Tuple[int, bytes]:
        if path.startswith(b"/" + CONTROL_PREFIX):
            return 403, b""  # dtlaunch's own scopes: the agent's, not a rank's
        if method == b"PUT" and path.startswith(b"/worker_addresses/"):
            # Where this rank's Horovod listens for "hosts updated": kept here, for this
            # agent to tell it on the driver's word; nothing about it crosses the network.
            found = worker_address(path, body)
            if found is None:
                return 400, b""
            self.workers[found[0]] = found[1]
            return 200, b""
        timeout = self.round_timeout if path.startswith(b"/rank_and_size/") else STORE_TIMEOUT
        return self._forward(method, path, body, timeout)

    def _forward(self, method: bytes, path: bytes, body: bytes,
                 timeout: float = STORE_TIMEOUT) -> Tuple[int, bytes]:
        # Its time first, so that the store may forget it once too old to be taken again.
        nonce = ("%x-" % int(time.time())).encode() + binascii.hexlify(os.urandom(16))
        mac = request_mac(self.secret, method, path, nonce, body)
        head = [method + b" " + path + b" HTTP/1.1", b"Host: dtlaunch",
                b"Content-Length: %d" % len(body),
                NONCE_HEADER.encode() + b": " + nonce,
                AUTH_HEADER.encode() + b": " + mac.encode("ascii"),
                b"Connection: close"]
        try:
            with socket.create_connection(self.store, timeout=timeout) as conn:
                conn.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
                got = read_request(conn, b"", status_line=True)
        except BadRequest as exc:
            # No deadline here, so 408 is the socket's own timeout: as for a refused connection.
            return (503 if exc.status == 408 else 502), b""
        except OSError:
            return 503, b""
        if got is None:
            return 502, b""  # the store closed the connection without answering
        _, status_text, headers, answer, _ = got
        status = int(status_text)
        expected = response_mac(self.secret, nonce, status, answer)
        if not hmac.compare_digest(headers.get(AUTH_HEADER.lower(), ""), expected):
            sys.stderr.write(PREFIX + "an answer not signed by the job's store was dropped\n")
            return 502, b""
        return status, answer


# --- the network ------------------------------------------------------------------------------


def ipv4_ifaces() -> List[Tuple[str, str]]:
    """(name, address) of each interface with an IPv4 address (Linux's SIOCGIFADDR)."""
    import fcntl

    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), 0x8915,  # SIOCGIFADDR
                                     struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            found.append((name, socket.inet_ntoa(packed[20:24])))
    return found


def _in_cidr(address: str, cidr: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(address) in ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        return False


def gloo_iface(cidrs: Sequence[str], store: Tuple[str, int]) -> Optional[str]:
    """HOROVOD_GLOO_IFACE when dtlaunch could not name it: the interface on one of the job's
    subnets (--iface CIDR), else the one this host reaches dtlaunch through."""
    try:
        ifaces = ipv4_ifaces()
    except (OSError, ImportError):
        return None
    for cidr in cidrs:
        for name, address in ifaces:
            if _in_cidr(address, cidr):
                return name
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(store)
            source = probe.getsockname()[0]
    except OSError:
        return None
    for name, address in ifaces:
        if address == source and not address.startswith("127."):
            return name
    return None


def own_name_problem(timeout: float = 10.0) -> Optional[str]:
    """Why this host's own name does not resolve here, or None. Horovod's Gloo process sets
    look it up, and a rank crashes (SIGSEGV, Horovod 0.28.1) when it does not resolve."""
    name = socket.gethostname()
    found: List[Optional[str]] = []

    def look() -> None:
        try:
            socket.getaddrinfo(name, None)
            found.append(None)
        except (OSError, UnicodeError) as exc:
            found.append(str(exc))

    thread = threading.Thread(target=look, daemon=True)
    thread.start()
    thread.join(timeout)
    if not found:
        return "its own name %r did not resolve within %g s" % (name, timeout)
    if found[0] is not None:
        return "its own name %r does not resolve (%s)" % (name, found[0])
    return None


# --- the ranks ---------------------------------------------------------------------------------


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signum)


class Agent:
    def __init__(self, job: Dict[str, Any]) -> None:
        self.job = job
        self.stop = threading.Event()
        self.procs: List[subprocess.Popen[bytes]] = []

    def stop_on_signals_and_eof(self) -> None:
        """SIGTERM, SIGINT, SIGHUP or the end of standard input (dtlaunch gone) stop the job."""
        def on_signal(_signum: int, _frame: object) -> None:
            self.stop.set()

        def watch_stdin() -> None:
            # Read from the descriptor: what the boot line's reader holds beyond the job is
            # nothing.
            with contextlib.suppress(OSError):
                while os.read(0, 4096):
                    pass
            self.stop.set()

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, on_signal)
        threading.Thread(target=watch_stdin, daemon=True).start()

    def base_env(self) -> Dict[str, str]:
        base = dict(os.environ)
        for name in self.job.get("unset") or ():
            base.pop(name, None)  # srun's one-task identity, which no rank has
        base.update(self.job["env"])
        if "HOROVOD_GLOO_IFACE" not in base and "store" in self.job:
            iface = gloo_iface(self.job.get("iface_cidrs") or [],
                               (self.job["store"]["host"], int(self.job["store"]["port"])))
            if iface is not None:
                base["HOROVOD_GLOO_IFACE"] = iface
        return base

    def start_with(self, extra: Dict[str, str],
                   each: Optional[Callable[[Dict[str, Any]], Dict[str, str]]] = None,
                   ) -> Optional[int]:
        """Every rank of this host under the rank shim: the job's variables, the rank's,
        `extra` and `each(rank)`'s. A rank may carry an argv of its own (a torch job's
        per-local-rank arguments)."""
        base = self.base_env()
        for rank in self.job["ranks"]:
            env = dict(base)
            env.update(rank["env"])
            env.update(extra)
            if each is not None:
                env.update(each(rank))
            name = rank["env"].get("HOROVOD_RANK", rank["env"].get("RANK"))
            proc = self.spawn(rank.get("argv") or self.job["shim"], env, "rank %s" % name)
            if proc is None:
                return 127
            self.procs.append(proc)
        return None

    def spawn(self, argv: List[str], env: Dict[str, str], what: str,
              ) -> Optional[subprocess.Popen[bytes]]:
        """One rank under the rank shim, or None when it cannot start (said on stderr). In
        dtlaunch's directory when the host has it, as MPI launchers do."""
        cwd = self.job.get("cwd")
        try:
            return subprocess.Popen(argv, env=env, cwd=cwd if cwd and os.path.isdir(cwd) else None,
                                    stdin=subprocess.DEVNULL)
        except OSError as exc:
            sys.stderr.write(PREFIX + "cannot start %s: %s\n" % (what, exc.strerror or exc))
            return None

    def end_ranks(self) -> None:
        """SIGTERM to every rank's shim (which stops its program), then SIGKILL to whatever is
        left in this session."""
        for proc in self.procs:
            if proc.poll() is None:
                _signal(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + RANK_GRACE
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(0.05)
        # Over ssh, sshd gave the command a session of its own: what a rank left there (a
        # double-forked daemon) goes too, every live process in it but this one and sshd.
        # Here, beside dtlaunch, the session is the job's.
        sid, spared = os.getsid(0), (os.getpid(), os.getppid())
        for _ in range(20 if self.job.get("sweep") else 0):
            left = [pid for pid, fields in _stats() if pid not in spared and len(fields) > 3
                    and int(fields[3]) == sid and fields[0] != b"Z"]
            if not left:
                break
            for pid in left:
                _signal(pid, signal.SIGKILL)
            time.sleep(0.05)
        for proc in self.procs:
            if proc.poll() is None:
                _signal(proc.pid, signal.SIGKILL)
                proc.wait()

    def wait(self) -> int:
        """Until every rank has ended (the first failure's code) or the job is stopped."""
        code = 0
        running = list(self.procs)
        while running and not self.stop.is_set():
            for proc in list(running):
                status = proc.poll()
                if status is not None:
                    running.remove(proc)
                    if status != 0 and code == 0:
                        code = status if status > 0 else 128 - status
            self.stop.wait(0.05)
        if running:
            self.end_ranks()
            return code or 143
        return code


# --- elastic: the driver's plan for this host -------------------------------------------------

CONTROL_PREFIX = b"_dtlaunch_"
POLL_TIMEOUT = 20.0  # the store answers a plan poll within 5 s


class _NoGlobals(pickle.Unpickler):
    """Plain containers only: a pickle that names any class or function is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError("refused: %s.%s" % (module, name))


def worker_address(path: bytes, body: bytes) -> Optional[Tuple[int, Tuple[int, bytes]]]:
    """(local rank, (port, key)) from a rank's PUT /worker_addresses/HOST:LOCAL_RANK, whose
    body is Horovod's base64 pickle of ({iface: [(address, port)]}, key): read with no class
    allowed, from this user's own rank on this host."""
    _, _, key = path.rpartition(b"/")
    _, _, local = key.rpartition(b":")
    try:
        addresses, secret = _NoGlobals(io.BytesIO(binascii.a2b_base64(body))).load()
        ports = [int(pair[1]) for pairs in addresses.values() for pair in pairs]
        if not local.isdigit() or not ports or not isinstance(secret, bytes):
            return None
        return int(local), (ports[0], secret)
    except Exception:  # anything malformed: refused
        return None


def hosts_updated_pickle(timestamp: int, result: int) -> bytes:
    """Horovod's HostsUpdatedRequest(timestamp, result), written opcode by opcode (protocol 2)
    so that this agent needs no Horovod: the class by name, then its two attributes."""

    def text(value: str) -> bytes:
        data = value.encode("utf-8")
        return b"X" + struct.pack("<I", len(data)) + data

    def number(value: int) -> bytes:
        data = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
        return b"\x8a" + bytes([len(data)]) + data

    return (b"\x80\x02chorovod.runner.elastic.worker\nHostsUpdatedRequest\n)\x81}("
            + text("timestamp") + number(timestamp) + text("res") + number(result)
            + b"ub.")


def tell_hosts_updated(port: int, key: bytes, timestamp: int, result: int) -> None:
    """One request to a rank's notification service on this host (Horovod's wire: HMAC-SHA256
    of the message, its length, the message); its answer is read and dropped, not unpickled."""
    message = hosts_updated_pickle(timestamp, result)
    digest = hmac.new(key, message, hashlib.sha256).digest()
    with socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT) as conn:
        conn.sendall(digest + struct.pack("i", len(message)) + message)
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(65536):
            pass


class ElasticAgent(Agent):
    """Runs the local ranks the driver's plan names, drains those it no longer names, reports
    each worker's end, and hands rank 0's notification to its Horovod."""

    def __init__(self, job: Dict[str, Any], forwarder: Forwarder) -> None:
        Agent.__init__(self, job)
        self.forwarder = forwarder
        self.host = job["host"]
        self.running: Dict[int, Tuple[int, subprocess.Popen[bytes]]] = {}
        self.drained: List[subprocess.Popen[bytes]] = []
        self.told = 0
        self.pending: Optional[Tuple[int, int, int]] = None

    def run(self) -> int:
        gen = -1
        quiet_until = 0.0
        while not self.stop.is_set():
            self.reap()
            self.deliver()
            path = ("/%splan/%s:%d:%d" % (CONTROL_PREFIX.decode(), self.host,
                                          int(self.job.get("token") or 0), gen)).encode()
            status, body = self.forwarder._forward(b"GET", path, b"", POLL_TIMEOUT)
            if status == 200:
                try:
                    plan = json.loads(body.decode("utf-8"))
                    gen = int(plan["gen"])
                except (ValueError, KeyError, TypeError):
                    continue
                if plan.get("end"):
                    break  # the job is over, or this host has a newer agent
                self.apply(plan)
            elif status != 404 and time.monotonic() >= quiet_until:
                quiet_until = time.monotonic() + 30
                sys.stderr.write(PREFIX + "host %s: the job's store answered %d\n"
                                 % (self.host, status))
                self.stop.wait(1.0)
        self.procs = [proc for _, proc in self.running.values()] + self.drained
        self.end_ranks()
        return 0

    def apply(self, plan: Dict[str, Any]) -> None:
        wanted = {int(lr): rank for lr, rank in plan.get("ranks", {}).items()}
        for lr, (wid, _proc) in list(self.running.items()):
            if lr not in wanted or int(wanted[lr]["id"]) != wid:
                self.drain(lr)
        for lr, rank in sorted(wanted.items()):
            if lr not in self.running:
                self.start_rank(lr, int(rank["id"]), rank["env"])
        if plan.get("notify"):
            timestamp, result, lr = (int(v) for v in plan["notify"])
            if timestamp > self.told:
                self.pending = (timestamp, result, lr)

    def start_rank(self, lr: int, wid: int, rank_env: Dict[str, str]) -> None:
        env = self.base_env()
        env.update(rank_env)
        env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] = "127.0.0.1"
        env["HOROVOD_GLOO_RENDEZVOUS_PORT"] = str(self.forwarder.port)
        self.forwarder.workers.pop(lr, None)
        proc = self.spawn(self.job["shim"], env, "worker %d" % wid)
        if proc is None:
            self.report(lr, wid, 127)
            return
        self.running[lr] = (wid, proc)

    def drain(self, lr: int) -> None:
        """A worker the job no longer has a place for: stopped, not reported as failed."""
        _, proc = self.running.pop(lr)
        self.forwarder.workers.pop(lr, None)
        if proc.poll() is None:
            _signal(proc.pid, signal.SIGTERM)
            self.drained.append(proc)

    def reap(self) -> None:
        for lr, (wid, proc) in list(self.running.items()):
            status = proc.poll()
            if status is not None:
                del self.running[lr]
                self.report(lr, wid, status if status >= 0 else 128 - status)
        self.drained = [proc for proc in self.drained if proc.poll() is None]

    def report(self, lr: int, wid: int, code: int) -> None:
        path = ("/%sexit/%s:%d:%d" % (CONTROL_PREFIX.decode(), self.host, lr, wid)).encode()
        for _ in range(5):
            status, _ = self.forwarder._forward(b"PUT", path, str(code).encode())
            if status == 200:
                return
            self.stop.wait(1.0)

    def deliver(self) -> None:
        if self.pending is None:
            return
        timestamp, result, lr = self.pending
        where = self.forwarder.workers.get(lr)
        if where is None:
            return  # its Horovod has not registered yet: tried again at the next poll
        try:
            tell_hosts_updated(where[0], where[1], timestamp, result)
        except OSError as exc:
            sys.stderr.write(PREFIX + "could not tell rank 0 on %s of the new hosts: %s\n"
                             % (self.host, exc))
        self.told, self.pending = timestamp, None


def main(stream: BinaryIO) -> int:
    try:
        job = json.loads(stream.readline().decode("utf-8"))
        secret = binascii.unhexlify(job["store"]["secret"])
        store_host, store_port = job["store"]["host"], int(job["store"]["port"])
    except (ValueError, KeyError, TypeError):
        sys.stderr.write(PREFIX + "expected the job on standard input\n")
        return 2
    problem = own_name_problem()
    if problem is not None:
        sys.stderr.write(PREFIX + "host %s: %s; Horovod's Gloo controller needs every host to "
                         "resolve its own name: add it to /etc/hosts there (or DNS)\n"
                         % (job.get("host", "?"), problem))
        return 1
    forwarder = Forwarder(store_host, store_port, secret,
                          float(job.get("round_timeout") or STORE_TIMEOUT))
    agent = ElasticAgent(job, forwarder) if job.get("elastic") else Agent(job)
    agent.stop_on_signals_and_eof()
    forwarder.start()
    try:
        if isinstance(agent, ElasticAgent):
            return agent.run()
        code = agent.start_with({"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
                                 "HOROVOD_GLOO_RENDEZVOUS_PORT": str(forwarder.port)})
        if code is not None:
            agent.end_ranks()
            return code
        return agent.wait()
    finally:
        forwarder.close()
        sys.stderr.flush()


def run(stream: BinaryIO, entry: Optional[Callable[[BinaryIO], int]] = None) -> NoReturn:
    """main (or the agent's `entry` that builds on this one), then out at once: threads
    blocked in reads must not hold up the exit."""
    code = 1
    try:
        code = (entry or main)(stream)
    finally:
        for handle in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                handle.flush()
        os._exit(code)


if __name__ == "dtlaunch_gloo_host":
    run(globals()["STREAM"])  # given by the boot line
