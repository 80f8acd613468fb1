"""Starts a Gloo job's host agents, one per host, and joins their output: the Gloo job's
launcher, as mpirun is an MPI job's (dtlaunch runs it under the lifeline, in a session of its
own).

Everything comes on standard input as one JSON document, nothing on the command line: for each
host the argv that reaches it (dtlaunch's ssh wrapper rsh.py, or the agent itself for this
machine) and the bytes that host's agent reads on its standard input (its code and its job,
secrets included). Each agent's standard input then stays open: closing it ends that host's
ranks. So:

- the first agent that ends with a failure, or SIGTERM/SIGINT/SIGHUP here, closes every
  agent's input; an agent still running RANK_STOP seconds later gets SIGTERM (rsh passes it to
  its ssh, whose end closes the remote input just the same);
- this process exits when every agent has: 0, or the first failure's status.

Each agent's stdout (the ranks' records, each one line of at most PIPE_BUF bytes) and stderr
(its own and ssh's lines) are read line by line and written here whole, so lines of different
hosts never mix.

A torch.distributed job (dtlaunch.torchrun) starts the same way, with one step more: its
store is held by host 0's agent, which binds the master address and port and says so on its
stderr (MASTER_LINE); the other hosts' inputs name them as placeholders and are written once
that line has come (their ssh connections open meanwhile).

Standard library only, no dtlaunch imports: it starts with -I -S, once per job.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import selectors
import signal
import subprocess
import sys
import threading
import time

RANK_STOP = 4.0  # seconds the agents get to stop their ranks before they are signalled
LINE_LIMIT = 64 * 1024  # a line longer than this is passed on in pieces
STOPPING = "dtlaunch-gloo: "
MASTER_LINE = b"dtlaunch-torch: master "  # ADDR PORT, from host 0's agent of a torch job
MASTER_ADDR, MASTER_PORT = b"@DTLAUNCH_MASTER_ADDR@", b"@DTLAUNCH_MASTER_PORT@"


class Host:
    def __init__(self, name: str, argv: list[str], payload: bytes) -> None:
        self.name = name
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.payload = payload
        self.partial = {1: b"", 2: b""}
        # A torch job's host other than host 0: its input waits for the master's address.
        self.held = MASTER_PORT in payload

    def release(self, addr: bytes, port: bytes) -> None:
        """The master's address is known: the held input, completed, is written."""
        self.payload = self.payload.replace(MASTER_ADDR, addr).replace(MASTER_PORT, port)
        self.held = False
        threading.Thread(target=self.feed_input, daemon=True).start()

    def feed_input(self) -> None:
        """The agent's code and job; its input then stays open (in a thread: a long job
        description must not wait for another host's ssh)."""
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write(self.payload)
            self.proc.stdin.flush()

    def pass_on(self, fd_out: int, data: bytes, hosts: list[Host]) -> None:
        """What the agent wrote on its stdout or stderr (`fd_out`), written here a whole line
        at a time (a line past LINE_LIMIT in pieces); `data` empty: the stream's end, where
        what is left of its last line goes."""
        if not data:
            if self.partial[fd_out]:
                write_all(fd_out, self.partial[fd_out] + b"\n")
                self.partial[fd_out] = b""
            return
        buf = self.partial[fd_out] + data
        cut = buf.rfind(b"\n") + 1
        if cut == 0 and len(buf) > LINE_LIMIT:
            cut = len(buf)
        if cut:
            whole = buf[:cut]
            if fd_out == 2 and MASTER_LINE in whole:
                whole = master_line(whole, hosts)
            write_all(fd_out, whole)
        self.partial[fd_out] = buf[cut:]


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    with contextlib.suppress(BrokenPipeError):  # a signal's EINTR is retried (PEP 475)
        while view:
            view = view[os.write(fd, view):]


def host_spec(entry: dict) -> tuple[str, list[str], bytes]:  # type: ignore[type-arg]
    return entry["name"], list(entry["argv"]), entry["input"].encode("utf-8")


def read_additions(added: queue.SimpleQueue[tuple[str, list[str], bytes]],
                   stop: threading.Event) -> None:
    """An elastic job's later hosts, one JSON line each; the end of input ends the job."""
    for line in sys.stdin.buffer:
        try:
            added.put(host_spec(json.loads(line.decode("utf-8"))))
        except (ValueError, KeyError, TypeError):
            continue
    stop.set()


def master_line(lines: bytes, hosts: list[Host]) -> bytes:
    """Host 0's report of the master address, taken out of its stderr: every held host's
    input is released with it. The other lines are returned."""
    kept = []
    for line in lines.splitlines(keepends=True):
        if line.startswith(MASTER_LINE):
            words = line[len(MASTER_LINE):].split()
            if len(words) == 2 and words[1].isdigit():
                for other in hosts:
                    if other.held:
                        other.release(words[0], words[1])
                continue
        kept.append(line)
    return b"".join(kept)


def main() -> int:
    global STOPPING
    try:
        job = json.loads(sys.stdin.buffer.readline().decode("utf-8"))
        specs = [host_spec(h) for h in job["hosts"]]
        STOPPING = str(job.get("prefix") or STOPPING)
    except (ValueError, KeyError, TypeError):
        sys.stderr.write(STOPPING + "expected the job on standard input\n")
        return 2
    # Elastic: hosts come and go. A host's agent ending is the driver's business (it sees the
    # agent fall silent), not a reason to stop the others; the job ends when dtlaunch closes
    # this process's input.
    elastic = bool(job.get("elastic"))
    stop = threading.Event()
    received: list[int] = []
    added: queue.SimpleQueue[tuple[str, list[str], bytes]] = queue.SimpleQueue()
    if elastic:
        threading.Thread(target=read_additions, args=(added, stop), daemon=True).start()

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    hosts: list[Host] = []
    selector = selectors.DefaultSelector()

    def say(text: str) -> None:
        write_all(2, f"{STOPPING}{text}\n".encode())

    def start(name: str, argv: list[str], payload: bytes) -> bool:
        """The host's agent started, fed and followed; False (said) when it cannot start."""
        try:
            host = Host(name, argv, payload)
        except OSError as exc:
            say(f"cannot start the agent for host {name}: {argv[0]}: {exc.strerror}")
            return False
        hosts.append(host)
        if not host.held:
            threading.Thread(target=host.feed_input, daemon=True).start()
        for fd_out, stream in ((1, host.proc.stdout), (2, host.proc.stderr)):
            assert stream is not None
            os.set_blocking(stream.fileno(), False)
            selector.register(stream.fileno(), selectors.EVENT_READ, (host, fd_out))
        return True

    code = 0
    if not all(start(*spec) for spec in specs):
        code = 127
        stop.set()
    stop_at: float | None = None
    signalled = False
    ended: set[int] = set()
    while (selector.get_map() or any(h.proc.poll() is None for h in hosts)
           or (elastic and not stop.is_set())):
        while not added.empty():
            spec = added.get()
            if not stop.is_set():
                start(*spec)
        if not selector.get_map():
            time.sleep(0.1)  # an elastic job between hosts: nothing to select on
        for key, _ in selector.select(timeout=0.1):
            host, fd_out = key.data
            try:
                data = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not data:
                selector.unregister(key.fd)
            host.pass_on(fd_out, data, hosts)
        for host in hosts:
            status = host.proc.poll()
            if status is None or id(host) in ended:
                continue
            ended.add(id(host))
            if elastic:
                if status != 0 and not stop.is_set():
                    say(f"the agent on host {host.name} ended with status {status}")
                continue
            if status != 0 and code == 0:
                code = status if status > 0 else 128 - status
                if not stop.is_set():
                    # Not stopped by us: its ranks failed, or the agent could not run there.
                    say(f"the agent on host {host.name} ended with status {code}")
                    stop.set()
        if stop.is_set() and stop_at is None:
            stop_at = time.monotonic() + RANK_STOP
            for host in hosts:
                assert host.proc.stdin is not None
                with contextlib.suppress(OSError, ValueError):
                    host.proc.stdin.close()
        if stop_at is not None and not signalled and time.monotonic() >= stop_at:
            signalled = True
            for host in hosts:
                if host.proc.poll() is None:
                    host.proc.send_signal(signal.SIGTERM)
    if received and code == 0:
        code = 128 + received[0]
    return code


if __name__ == "__main__":
    status = main()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    # Out at once: an elastic job's input reader may still hold standard input's lock.
    os._exit(status)
