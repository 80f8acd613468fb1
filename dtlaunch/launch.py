"""Run mpirun as a child: stream tagged output live, forward signals, enforce --timeout.

The only module that starts the job. mpirun gets its own session so that a terminal's Ctrl-C
reaches dtlaunch alone, which forwards it once and escalates if mpirun does not finish.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from dtlaunch.errors import EXIT_TIMEOUT, exit_for_signal
from dtlaunch.failures import Failure
from dtlaunch.mpi import MpiFamily
from dtlaunch.openmpi import OPEN_MPI
from dtlaunch.output import Line
from dtlaunch.rsh import LOST_PREFIX

# After forwarding a signal, how long mpirun gets to take its ranks down before we kill it.
GRACE_SECONDS = 6.0


@dataclass(frozen=True)
class LaunchResult:
    exit_code: int
    failure: Failure | None
    interrupted_by: int | None = None  # signal number dtlaunch received
    timed_out: bool = False


class _Output:
    """Prints rank lines with a short `[rank@host]` prefix and keeps mpirun's own lines."""

    def __init__(self, rank_hosts: Sequence[str], output_dir: Path | None,
                 family: MpiFamily = OPEN_MPI) -> None:
        self.rank_hosts = rank_hosts
        self.lock = threading.Lock()
        self.demux = family.new_demux()
        self.mpirun_lines: deque[str] = deque(maxlen=400)
        self.files: dict[str, IO[str]] = {}
        self.output_dir = output_dir
        self.lost_host: str | None = None

    def _log(self, key: str, text: str) -> None:
        if self.output_dir is None:
            return
        handle = self.files.get(key)
        if handle is None:
            handle = open(self.output_dir / f"{key}.log", "a", encoding="utf-8")  # noqa: SIM115
            self.files[key] = handle
        handle.write(text + "\n")
        handle.flush()

    def _emit(self, line: Line) -> None:
        stream = sys.stdout if line.stream == "stdout" else sys.stderr
        if line.rank is None:
            if line.text.startswith(LOST_PREFIX) and self.lost_host is None:
                self.lost_host = line.text[len(LOST_PREFIX):].split()[0]
            self.mpirun_lines.append(line.text)
            sys.stderr.write(line.text + "\n")
            sys.stderr.flush()
            self._log("mpirun", line.text)
            return
        host = self.rank_hosts[line.rank] if line.rank < len(self.rank_hosts) else "?"
        stream.write(f"[{line.rank}@{host}] {line.text}\n")
        stream.flush()
        self._log(f"rank.{line.rank}", line.text)

    def feed(self, raw: bytes, from_stderr: bool) -> None:
        text = raw.decode("utf-8", errors="replace")
        with self.lock:
            for line in self.demux.feed(text, from_stderr):
                self._emit(line)

    def close(self) -> None:
        with self.lock:
            for line in self.demux.flush():
                self._emit(line)
        for handle in self.files.values():
            handle.close()


def _pump(pipe: IO[bytes], sink: Callable[[bytes], None]) -> None:
    for raw in iter(pipe.readline, b""):
        sink(raw)
    pipe.close()


def _signal(proc: subprocess.Popen[bytes], signum: int) -> None:
    """Signal mpirun unless it is already gone; Popen skips a child it has reaped, so a
    recycled pid is never hit."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signum)


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL mpirun's whole session (local ranks included); remote orteds lose their
    lifeline when mpirun's ssh links close and take their ranks down."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def execute(
    argv: Sequence[str],
    env: Mapping[str, str],
    rank_hosts: Sequence[str],
    timeout: float | None = None,
    output_dir: Path | None = None,
    announce: Callable[[str], None] = lambda msg: None,
    stop_when: Callable[[], str | None] | None = None,
    family: MpiFamily = OPEN_MPI,
    support_files: Sequence[tuple[str, str]] = (),
) -> LaunchResult:
    """Run mpirun (or the family's launcher) to the end. ``stop_when`` is polled while it runs:
    a returned reason stops the job (used by the pre-flight's host-key check that runs
    alongside the start). ``support_files`` are written first (the family's ssh agent)."""
    if output_dir is not None:
        output_dir.mkdir(parents=True, exist_ok=True)
    for path, text in support_files:
        write_private_executable(Path(path), text)
    out = _Output(rank_hosts, output_dir, family)
    received: list[int] = []
    proc = subprocess.Popen(
        list(argv),
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    pumps = [
        threading.Thread(target=_pump, args=(proc.stdout, lambda b: out.feed(b, False)), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, lambda b: out.feed(b, True)), daemon=True),
    ]
    for thread in pumps:
        thread.start()

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        _signal(proc, signum)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, on_signal) for s in handled}
    deadline = time.monotonic() + timeout if timeout else None
    timed_out = False
    lost_host: str | None = None
    stopped_for: str | None = None
    stop_requested_at: float | None = None
    # A thread blocks in wait() so the job's end is seen at once; the main thread stays free
    # to run signal handlers and to enforce deadlines.
    finished = threading.Event()

    def reap() -> None:
        proc.wait()
        finished.set()

    threading.Thread(target=reap, daemon=True).start()
    try:
        while not finished.wait(0.1):
            now = time.monotonic()
            if deadline is not None and now >= deadline and not timed_out:
                timed_out = True
                announce(f"job still running after --timeout {timeout:g} s: stopping it")
                _signal(proc, signal.SIGTERM)
            if out.lost_host is not None and lost_host is None:
                lost_host = out.lost_host
                announce(f"lost the SSH connection to host {lost_host}: stopping the job")
                _signal(proc, signal.SIGTERM)
            if stop_when is not None and stopped_for is None:
                stopped_for = stop_when()
                if stopped_for is not None:
                    announce(stopped_for)
                    _signal(proc, signal.SIGTERM)
            if (received or timed_out or lost_host or stopped_for) and stop_requested_at is None:
                stop_requested_at = now
            if stop_requested_at is not None and now - stop_requested_at > GRACE_SECONDS:
                announce(f"{family.launcher} did not stop in time: killing it")
                _kill_tree(proc)
                stop_requested_at = float("inf")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        # Anything still in mpirun's session (e.g. a rank that ignored SIGTERM) goes too.
        _kill_tree(proc)
        for thread in pumps:
            thread.join(timeout=5)
        out.close()

    code = proc.returncode
    exit_code = code if code >= 0 else 128 - code
    failure = family.parse_failure(list(out.mpirun_lines), rank_hosts) if code != 0 else None
    if received or timed_out:
        # Hydra reports the ranks it stopped as failures; they are not the job's fault.
        kept = failure if family is OPEN_MPI else None
        if received:
            return LaunchResult(exit_for_signal(received[0]), kept, interrupted_by=received[0])
        return LaunchResult(EXIT_TIMEOUT, kept, timed_out=True)
    if stopped_for is not None:
        return LaunchResult(exit_code or 1, Failure(reason=stopped_for))
    if lost_host is not None:
        lost = Failure(host=lost_host, reason=f"lost the SSH connection to host {lost_host}")
        return LaunchResult(exit_code or 1, lost)
    if exit_code != 0 and failure is None:
        failure = Failure(reason=f"{family.launcher} exited with status {exit_code}")
    return LaunchResult(exit_code, failure)


def write_private_executable(path: Path, text: str) -> None:
    """Write a small program only its owner may change; kept when it is already there as
    written (its name is its content's hash), replaced atomically otherwise."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        info = path.stat()
        if (info.st_uid == os.geteuid() and not info.st_mode & 0o022
                and path.read_text(encoding="utf-8") == text):
            return
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, 0o700)
    os.replace(tmp, path)
