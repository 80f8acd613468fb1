"""A running job's output: the ranks' bytes to the console with a `[rank@host]` prefix, to
`--output-dir`, and the launcher's own lines kept for the failure analysis.

The launcher's two pipes are read in pieces (dtlaunch.core.records turns them into events). A rank's
whole lines are printed at once; a line still open is held back briefly so that lines of
different ranks do not mix, and printed anyway once it is old (`tick`) or long, so a rank
printing 100 MB without a newline shows it as it comes and memory stays bounded. A `\\r`
redraws the rank's line, prefix included (progress bars show live). Memory: at most FRAGMENT bytes
held per rank and stream, and LOG_BUFFER for the log files.

Write errors never stop the output: a log file that cannot be written gets one warning and is
dropped; a console whose reader went away (`dtlaunch run ... | head -1`) is noted in
`broken_pipe`, and the job is stopped as if SIGPIPE had been received.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from dtlaunch.agents import HOST_KEY_PREFIX, LOST_PREFIX
from dtlaunch.core.records import Event, Piece, RankExit, RankHost, RankNotStarted
from dtlaunch.job.hosts import LOOPBACK
from dtlaunch.openmpi.output import OpenMpiDemux
from dtlaunch.run.events import HOSTS_UP, RANKS_RUNNING, Progress
from dtlaunch.run.failure_report import TAIL_BYTES, JobRanks, RankEnd, tail_lines

if TYPE_CHECKING:
    from pathlib import Path

    from dtlaunch.mpi import OutputDemux

FRAGMENT = 64 * 1024  # an open line this long is printed without waiting for its end
LIVE_DELAY = 0.2  # seconds an open line waits for its end before it is printed as it is
LOG_CHUNK = 64 * 1024  # per log file, written once this much has gathered
LOG_BUFFER = 1024 * 1024  # all log files together


def _short(name: str) -> str:
    return name.split(".", 1)[0].lower()


def host_name(reported: str, predicted: str | None, given: Sequence[str]) -> str:
    """The name to show for a rank's host: the user's own spelling (`-H` name) of the host the
    rank said it runs on, when one matches; else the name the rank reported."""
    # os.uname's nodename is what gethostname() returns, without importing socket (which the
    # output pump's thread would then import: test_no_worker_thread_imports_a_module).
    if predicted is not None and (_short(reported) == _short(predicted) or (
            predicted in LOOPBACK and _short(reported) == _short(os.uname().nodename))):
        return predicted
    for name in dict.fromkeys(given):
        if _short(name) == _short(reported):
            return name
    return reported


def earlier_logs(directory: Path) -> list[str]:
    """The log files an earlier run left in an --output-dir, sorted; [] when there are none."""
    try:
        return sorted({p.name for pattern in ("rank.*.log", "mpirun.log")
                       for p in directory.glob(pattern)}, key=lambda n: (len(n), n))
    except OSError:
        return []


class LogFiles:
    """`--output-dir`: DIR/rank.N.log (the rank's exact bytes) and DIR/mpirun.log. Opened for
    each write of a gathered chunk and closed again, so no handle is held per rank.

    A file that already has content (an earlier attempt's, or an earlier run's), or any file
    when ``label`` is given (each attempt under --max-restarts), gets a marker line first,
    `--- dtlaunch: attempt 2 (restart 1) on h3, <time> ---`, on a line of its own."""

    def __init__(self, directory: Path | None, warn: Callable[[str], None], label: str | None,
                 host_of: Callable[[str], str | None], clock: Callable[[], float]) -> None:
        self.directory = directory
        self.warn = warn
        self.buffers: dict[str, bytearray] = {}
        self.held = 0
        self.failed: set[str] = set()
        self.label = label
        self.host_of = host_of
        self.clock = clock
        self.started: set[str] = set()  # files this run has written to already

    def write(self, key: str, data: bytes) -> None:
        if self.directory is None or key in self.failed:
            return
        buf = self.buffers.setdefault(key, bytearray())
        buf += data
        self.held += len(data)
        if len(buf) >= LOG_CHUNK:
            self._flush(key)
        elif self.held >= LOG_BUFFER:
            self.flush()

    def _flush(self, key: str) -> None:
        data = self.buffers.pop(key)
        self.held -= len(data)
        assert self.directory is not None
        path = self.directory / f"{key}.log"
        try:
            with open(path, "ab+") as handle:
                if key not in self.started:
                    self.started.add(key)
                    handle.write(self._marker(handle, key))  # O_APPEND: at the end
                handle.write(data)
        except OSError as exc:
            self.failed.add(key)
            self.warn(f"cannot write {path}: {exc.strerror or exc}; no more of it is written "
                      "there (the console still shows everything)")

    def _marker(self, handle: BinaryIO, key: str) -> bytes:
        """What goes before this run's first bytes in the file: nothing for a new file
        without a label; else a line break if the file's last line is open, and the marker
        line that starts an attempt's (or a later run's) part."""
        size = handle.seek(0, os.SEEK_END)
        if size == 0 and self.label is None:
            return b""
        head = b""
        if size:
            handle.seek(size - 1)
            if handle.read(1) != b"\n":
                head = b"\n"  # an earlier part that ended mid-line stays whole
            handle.seek(0, os.SEEK_END)
        host = self.host_of(key)  # None for mpirun.log
        where = f" on {host}" if host else ""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.clock()))
        what = f"{self.label or 'a new run'}, {key.replace('.', ' ')}{where}"
        return head + f"--- dtlaunch: {what}, {stamp} ---\n".encode("utf-8", "surrogateescape")

    def flush(self) -> None:
        for key in list(self.buffers):
            self._flush(key)


class _Console:
    """One of dtlaunch's own streams, and which rank's line is still open on it."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.open: int | None = None  # rank whose line is not ended yet (-1: dtlaunch's own)
        self.at_start = False  # that line was ended by a bare \r
        self.out: list[bytes] = []
        self.dead = False


def _prefixed(prefix: bytes, data: bytes, first: bool) -> bytes:
    """`prefix` before `data` (when `first`) and after each line end inside it."""
    body = data.replace(b"\r\n", b"\n") if b"\r" in data else data  # `in`: memchr, fast
    end = body[-1:] if body[-1:] in (b"\n", b"\r") else b""
    inner = body[:len(body) - len(end)]
    inner = inner.replace(b"\n", b"\n" + prefix).replace(b"\r", b"\r" + prefix)
    return (prefix if first else b"") + inner + end


def _binary(stream: Any) -> BinaryIO:
    return cast(BinaryIO, getattr(stream, "buffer", stream))


def _first_word(text: str) -> str:
    """The host a lost-host or host-key line names first; "?" when it names none."""
    words = text.split()
    return words[0] if words else "?"


class JobOutput:
    def __init__(self, rank_hosts: Sequence[str], output_dir: Path | None, *,
                 new_demux: Callable[[str], OutputDemux] | None = None,
                 timestamps: bool = False, stdout: BinaryIO | None = None,
                 stderr: BinaryIO | None = None, clock: Callable[[], float] = time.time,
                 log_label: str | None = None, shown: frozenset[int] | None = None,
                 ranks_to_stderr: bool = False,
                 on_progress: Callable[[Progress], None] | None = None) -> None:
        self.predicted = tuple(rank_hosts)
        self.reported: dict[int, str] = {}
        self.exits: dict[int, str] = {}
        self.exit_times: dict[int, float] = {}
        # `--ranks`: the ranks whose output the console shows (None: all). The logs get all,
        # and every rank's latest bytes are kept (`tails`) for the failure report.
        self.shown = shown
        self.tails: dict[int, bytearray] = {}
        self.on_progress = on_progress
        self.starting = on_progress is not None  # the progress line may be up
        self.host_count = len(set(self.predicted))
        self.hosts_up: set[str] = set()  # hosts where a rank has started (as planned)
        self.not_started: dict[int, str] = {}  # rank -> the program that could not be run
        self.lock = threading.Lock()
        make = new_demux or OpenMpiDemux
        self.demux = {False: make("stdout"), True: make("stderr")}
        err_console = _Console(stderr or _binary(sys.stderr))
        # `--json`: stdout is the report's alone, so the ranks' stdout goes to stderr too.
        self.consoles = {"stdout": err_console if ranks_to_stderr
                         else _Console(stdout or _binary(sys.stdout)),
                         "stderr": err_console}
        self.pending: dict[tuple[int, str], bytearray] = {}
        self.since: dict[tuple[int, str], float] = {}
        self.launcher_lines: deque[str] = deque(maxlen=400)
        self.lost_host: str | None = None
        self.host_key_refused: str | None = None  # a host whose key ssh refused
        self.broken_pipe = False
        self.timestamps = timestamps
        self.clock = clock
        self.logs = LogFiles(output_dir, self._warn, log_label, self._log_host, clock)

    # --- what the pumps and the main loop call ------------------------------------------------

    def feed(self, data: bytes, from_stderr: bool) -> None:
        with self.lock:
            for event in self.demux[from_stderr].feed(data):
                self._take(event)
            self._write()

    def tick(self) -> None:
        """Print open lines that waited long enough; write gathered log output."""
        with self.lock:
            now = time.monotonic()
            for key, started in list(self.since.items()):
                if now - started >= LIVE_DELAY:
                    self._fragment(key)
            self.logs.flush()  # first: a log file that cannot be written warns on the console
            self._write()

    def close(self) -> None:
        with self.lock:
            for from_stderr in (False, True):
                for event in self.demux[from_stderr].flush():
                    self._take(event)
            for key in list(self.pending):
                self._fragment(key)
            for console in self.consoles.values():
                if console.open is not None:
                    console.out.append(b"\n")
                console.open = None
            self.logs.flush()  # first: its warning must reach the console too
            self._write()

    def _log_host(self, key: str) -> str | None:
        """The host of `rank.N`, for its log's marker line."""
        return self.host_of(int(key.split(".", 1)[1])) if key.startswith("rank.") else None

    def host_of(self, rank: int) -> str | None:
        """Where the rank said it runs, else where it was expected to."""
        return self.reported.get(rank) or (self.predicted[rank] if rank < len(self.predicted)
                                           else None)

    def job_ranks(self) -> JobRanks:
        """What the records told of each rank, for the failure report: its end (with the time
        its host gave), and the last lines of each that failed."""
        hosts = self.rank_hosts()
        order = {rank: index for index, rank in enumerate(self.exits)}
        ends = tuple(RankEnd(r, hosts[r], self.exits.get(r), self.exit_times.get(r),
                             order.get(r, len(order))) for r in range(len(hosts)))
        tails = {r: tail_lines(bytes(self.tails.get(r, b""))) for r in range(len(hosts))
                 if self.exits.get(r) != "exit 0"}
        return JobRanks(hosts, ends, tails, reported=bool(self.reported or self.exits))

    def _progress(self) -> None:
        if not self.starting or self.on_progress is None:
            return
        total = len(self.predicted)
        running = len(self.reported)
        final = running >= total
        self.on_progress(Progress(HOSTS_UP, min(len(self.hosts_up), self.host_count),
                                  self.host_count))
        self.on_progress(Progress(RANKS_RUNNING, running, total, final))
        self.starting = not final

    def rank_hosts(self) -> tuple[str, ...]:
        """rank -> host: where each rank said it runs, else where it was expected to."""
        count = max([len(self.predicted), *(r + 1 for r in self.reported)])
        return tuple(self.host_of(r) or "?" for r in range(count))

    # --- events -------------------------------------------------------------------------------

    def _take(self, event: Event) -> None:
        if isinstance(event, RankHost):
            predicted = self.predicted[event.rank] if event.rank < len(self.predicted) else None
            self.reported[event.rank] = host_name(event.host, predicted, self.predicted)
            self.hosts_up.add(predicted if predicted is not None else event.host)
            self._progress()
        elif isinstance(event, RankExit):
            self.exits[event.rank] = event.how
            if event.at is not None:
                self.exit_times[event.rank] = event.at
        elif isinstance(event, RankNotStarted):
            self.not_started[event.rank] = event.program
        elif event.rank is None:
            self._launcher_text(event.data)
        else:
            self._rank_bytes(event)

    def _launcher_text(self, data: bytes) -> None:
        for line in data.decode("utf-8", "replace").splitlines():
            if line.startswith(LOST_PREFIX) and self.lost_host is None:
                self.lost_host = _first_word(line[len(LOST_PREFIX):])
            if line.startswith(HOST_KEY_PREFIX) and self.host_key_refused is None:
                self.host_key_refused = _first_word(line[len(HOST_KEY_PREFIX):])
            if line.strip():
                self.launcher_lines.append(line)
        self._put("stderr", -1, data if data.endswith(b"\n") else data + b"\n", b"")
        self.logs.write("mpirun", data)

    def _rank_bytes(self, piece: Piece) -> None:
        assert piece.rank is not None
        key = (piece.rank, piece.stream)
        self.logs.write(f"rank.{piece.rank}", piece.data)
        tail = self.tails.get(piece.rank)
        if tail is None:
            tail = self.tails[piece.rank] = bytearray()
        tail += piece.data[-TAIL_BYTES:]
        if len(tail) > 2 * TAIL_BYTES:  # trimmed now and then, not on every piece
            del tail[:-TAIL_BYTES]
        if self.shown is not None and piece.rank not in self.shown:
            return  # `--ranks`: not on the console (its log and its tail have it)
        buf = self.pending.get(key)
        if buf is None:
            buf = self.pending[key] = bytearray()
            self.since[key] = time.monotonic()
        held = len(buf)
        buf += piece.data
        # Whole lines go out now. A \r starts a redraw of the line: what precedes it goes out,
        # the redrawn text waits like an open line (so a bar shows once it is drawn).
        newline, ret = piece.data.rfind(b"\n"), piece.data.rfind(b"\r")
        cut = held + (ret if ret > newline else newline + 1) if max(newline, ret) >= 0 else 0
        if cut > 0:
            self._put(piece.stream, piece.rank, bytes(buf[:cut]))
            del buf[:cut]
            self.since[key] = time.monotonic()
        if len(buf) >= FRAGMENT:
            self._fragment(key)
        elif not buf:
            del self.pending[key], self.since[key]

    def _fragment(self, key: tuple[int, str]) -> None:
        buf = self.pending.pop(key)
        del self.since[key]
        if buf:
            self._put(key[1], key[0], bytes(buf))

    # --- the console --------------------------------------------------------------------------

    def _prefix(self, rank: int) -> bytes:
        text = f"[{rank}@{self.host_of(rank) or '?'}] "
        if self.timestamps:
            now = self.clock()
            text = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + \
                f".{int(now * 1000) % 1000:03d} " + text
        return text.encode("utf-8", "surrogateescape")

    def _put(self, stream: str, rank: int, data: bytes, prefix: bytes | None = None) -> None:
        console = self.consoles[stream]
        if console.open is not None and console.open != rank:
            console.out.append(b"\n")  # another rank's open line (or progress bar) ends here
            console.open = None
        if console.open is not None and console.at_start and data[:1] == b"\n":
            # A line break right after a redraw's \r (`50%\r` then `\n`): the redrawn line
            # stays as it is and ends here, with no empty tagged line after it.
            console.out.append(b"\n")
            console.open, console.at_start = None, False
            data = data[1:]
        if console.open is None:
            data = data.lstrip(b"\r")  # nothing of this rank's on the line to draw over
            if not data:
                return
        first = console.open is None or console.at_start
        console.out.append(_prefixed(self._prefix(rank) if prefix is None else prefix, data, first))
        ended = data[-1:]
        console.open = None if ended == b"\n" else rank
        console.at_start = ended == b"\r"

    def _warn(self, message: str) -> None:
        self._put("stderr", -1, f"dtlaunch: warning: {message}\n".encode(), b"")

    def _write(self) -> None:
        if self.starting and any(c.out for c in self.consoles.values()):
            # The job's own output begins: the progress line goes first.
            self.starting = False
            assert self.on_progress is not None
            self.on_progress(Progress(RANKS_RUNNING, len(self.reported), len(self.predicted),
                                      final=True))
        for console in self.consoles.values():
            if not console.out:
                continue
            data, console.out = b"".join(console.out), []
            if console.dead:
                continue
            try:
                console.handle.write(data)
                console.handle.flush()
            except OSError as exc:
                console.dead = True
                self.broken_pipe = self.broken_pipe or isinstance(exc, BrokenPipeError)
                # Nobody reads it any more: later writes (Python's own at exit too) go nowhere.
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    devnull = os.open(os.devnull, os.O_WRONLY)
                    os.dup2(devnull, console.handle.fileno())
                    os.close(devnull)
