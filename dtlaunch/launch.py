"""Run mpirun as a child: stream tagged output live, forward signals, enforce --timeout.

The only module that starts the job. mpirun gets its own session so that a terminal's Ctrl-C
reaches dtlaunch alone, which forwards it once and escalates if mpirun does not finish. mpirun
starts under a guard (dtlaunch.lifeline) that ends the job if dtlaunch itself is killed.
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
from dtlaunch.failures import Failure, analyze
from dtlaunch.lifeline import guarded_argv
from dtlaunch.output import Line, TagDemux
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
                 tag_space: bool = False) -> None:
        self.rank_hosts = rank_hosts
        self.lock = threading.Lock()
        self.demux = TagDemux(space_after_tag=tag_space)
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
    tag_space: bool = False,
) -> LaunchResult:
    """Run mpirun to the end. ``stop_when`` is polled while it runs: a returned reason stops
    the job (used by the pre-flight's host-key check that runs alongside the start).
    ``tag_space``: mpirun's output tags end with a space (Open MPI >= 5)."""
    if output_dir is not None:
        output_dir.mkdir(parents=True, exist_ok=True)
    out = _Output(rank_hosts, output_dir, tag_space)
    received: list[int] = []
    command, lifeline_read, lifeline_write = guarded_argv(list(argv))
    try:
        proc = subprocess.Popen(
            command,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=(lifeline_read,),
        )
    except BaseException:
        os.close(lifeline_write)
        raise
    finally:
        os.close(lifeline_read)
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
                announce("mpirun did not stop in time: killing it")
                _kill_tree(proc)
                stop_requested_at = float("inf")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        # Anything still in mpirun's session (e.g. a rank that ignored SIGTERM) goes too,
        # the lifeline's guard with it.
        _kill_tree(proc)
        os.close(lifeline_write)
        for thread in pumps:
            thread.join(timeout=5)
        out.close()

    if lost_host is None:
        # mpirun may end (Open MPI 5 at once, on its daemon's ssh exit) before the loop saw
        # the link watcher's line; the pumps have read it by now.
        lost_host = out.lost_host
    code = proc.returncode
    exit_code = code if code >= 0 else 128 - code
    failure = analyze(list(out.mpirun_lines), rank_hosts) if code != 0 else None
    if received:
        return LaunchResult(exit_for_signal(received[0]), failure, interrupted_by=received[0])
    if timed_out:
        return LaunchResult(EXIT_TIMEOUT, failure, timed_out=True)
    if stopped_for is not None:
        return LaunchResult(exit_code or 1, Failure(reason=stopped_for))
    if lost_host is not None:
        lost = Failure(host=lost_host, reason=f"lost the SSH connection to host {lost_host}")
        return LaunchResult(exit_code or 1, lost)
    if exit_code != 0 and failure is None:
        failure = Failure(reason=f"mpirun exited with status {exit_code}")
    return LaunchResult(exit_code, failure)
