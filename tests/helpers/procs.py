"""Finding, waiting for and ending processes through /proc: the one copy the tests share.

Tests assert that things end, never how fast they end (bench/ measures speed): every wait here
is bounded by HANG unless a test passes its own bound, and HANG only catches a hang.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

# Generous on purpose: a loaded 2-core machine is slow, not hung.
HANG = 120.0


def alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def cmdline(pid: int | str) -> bytes:
    """The raw NUL-separated argv of pid, or b"" when it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def pids_where(match: Callable[[bytes], bool]) -> list[int]:
    """Live processes whose raw cmdline satisfies `match`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            line = cmdline(entry)
            if line and match(line) and alive(int(entry)):
                found.append(int(entry))
    return found


def pids_running(*argv: str) -> list[int]:
    """Live processes whose argv is exactly `argv`."""
    wanted = b"".join(a.encode() + b"\0" for a in argv)
    return pids_where(lambda line: line == wanted)


def pids_containing(marker: str) -> list[int]:
    """Live processes with `marker` anywhere in their argv."""
    return pids_where(lambda line: marker.encode() in line)


def sleeping(seconds: str) -> list[int]:
    """Processes running exactly `sleep <seconds>`: tests give their hung stand-ins a number
    no other test uses and find them by it."""
    return pids_running("sleep", seconds)


def ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def descendants(pid: int) -> list[int]:
    """pid's children, theirs, and so on."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError):
                parents[int(entry)] = ppid(int(entry))
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found += kids
        todo += kids
    return found


def wait_for(condition: Callable[[], object], what: str, within: float = HANG,
             every: float = 0.05) -> None:
    """Poll until `condition()` is true; fail naming `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


def survivors(pids: Callable[[], Iterable[int]], within: float = HANG) -> list[int]:
    """Give the processes `pids()` lists `within` seconds to end; those still running."""
    deadline = time.monotonic() + within
    while (left := list(pids())) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def gone(pids: Iterable[int], within: float = HANG) -> list[int]:
    """Of `pids`, those still alive after waiting up to `within` seconds for them to end."""
    wanted = list(pids)
    return survivors(lambda: [p for p in wanted if alive(p)], within)


def read_pid(path: Path, what: str, within: float = HANG) -> int:
    """The pid a started process wrote into `path`, waiting for it to appear."""
    wait_for(lambda: path.exists() and path.read_text().strip(), what, within)
    return int(path.read_text().strip())


def kill_all(pids: Iterable[int]) -> None:
    """Clean-up: SIGKILL whatever a failed test left running."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def assert_kill_leaves_no_sleeper(proc: subprocess.Popen[bytes], seconds: str, started_within: float,
                                  never_started: str, outlived: str) -> None:
    """Once a `sleep <seconds>` stand-in runs under `proc` (else fail with `never_started`),
    SIGKILL `proc` and reap it: the stand-in must end within 10 s (a tie's SIGTERM, then its
    SIGKILL 2 s later), else fail with `outlived`. A stand-in a failed test left is killed."""
    try:
        wait_for(lambda: sleeping(seconds), never_started, started_within)
        proc.kill()
        proc.wait(timeout=30)
        assert survivors(lambda: sleeping(seconds), 10.0) == [], outlived
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_all(sleeping(seconds))


def listening_ports(pid: int) -> list[tuple[str, int]]:
    """The TCP addresses process `pid` listens on (its sockets, in /proc/net/tcp)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    with open("/proc/net/tcp") as handle:
        for line in list(handle)[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                addr, port = fields[1].split(":")
                ip = ".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0))
                found.append((ip, int(port, 16)))
    return found
