"""Read the launcher's output back into what each rank wrote. Pure code, bytes in, events out.

Every rank runs through dtlaunch.rank_shim, which writes records (`\\x1edtl1 RANK KIND B64\\n`,
see there) to the stdout the MPI collects. Open MPI's `--tag-output` then tags every chunk it
forwards, not every line: a record split by its I/O layer arrives as
`[1,0]<stdout>:\\x1edtl1 0 o YW[1,1]<stdout>:...\\n[1,0]<stdout>:Jj\\n`, interleaved with other
ranks' chunks. So the stream is cut at its tags, each rank's pieces are joined, and the joined
stream is cut into records; untagged text is the launcher's own message.

Everything is linear in the input and holds at most one record (about PIPE_BUF bytes) per
rank and stream, plus one line of the launcher's own text, capped.
"""

from __future__ import annotations

import binascii
import re
from dataclasses import dataclass, field
from typing import Union

from dtlaunch.rank_shim import EXIT, HOST, MAGIC, PIPE_BUF, STDERR, STDOUT

TAG_RE = re.compile(rb"\[(\d+),(\d+)\]<(stdout|stderr|stddiag)>:")
# What may still grow into a tag when more bytes come.
_TAG_START_RE = re.compile(rb"\[\d*(,\d*(\](<[a-z]{0,7}>?)?)?)?\Z")
TEXT_LIMIT = 64 * 1024  # a line of the launcher's own text longer than this is passed on in pieces
RECORD_LIMIT = 2 * PIPE_BUF  # more than this without a newline cannot be a record


@dataclass(frozen=True)
class Piece:
    """Bytes a rank wrote (rank set), or text of the launcher's own (rank None)."""

    rank: int | None
    stream: str  # "stdout" or "stderr"
    data: bytes


@dataclass(frozen=True)
class RankHost:
    rank: int
    host: str


@dataclass(frozen=True)
class RankExit:
    rank: int
    how: str  # "exit 3" or "signal 9"


Event = Union[Piece, RankHost, RankExit]
_STREAMS = {STDOUT: "stdout", STDERR: "stderr"}


def parse_record(line: bytes, default_rank: int | None) -> Event | None:
    """One record without its newline, or None when the line is not one."""
    parts = line.split(b" ", 3)
    if len(parts) != 4 or parts[0] + b" " != MAGIC:
        return None
    try:
        rank = int(parts[1])
        payload = binascii.a2b_base64(parts[3])
    except (ValueError, binascii.Error):
        return None
    if rank < 0:
        if default_rank is None:
            return None
        rank = default_rank
    kind = parts[2].decode("ascii", "replace")
    if kind in _STREAMS:
        return Piece(rank, _STREAMS[kind], payload)
    if kind == HOST:
        return RankHost(rank, payload.decode("utf-8", "replace"))
    if kind == EXIT:
        return RankExit(rank, payload.decode("ascii", "replace"))
    return None


@dataclass
class RecordParser:
    """Cuts one source's byte stream into records. What is not a record is passed on as raw
    bytes: a rank's (rank set, e.g. a traceback of the shim's own interpreter) or the
    launcher's (rank None)."""

    rank: int | None = None  # the source's rank when the launcher told it (a tag)
    stream: str = "stdout"
    _pending: bytes = b""

    def feed(self, data: bytes) -> list[Event]:
        buf = self._pending + data if self._pending else data
        out: list[Event] = []
        pos = 0
        while pos < len(buf):
            newline = buf.find(b"\n", pos)
            if buf.startswith(MAGIC, pos):
                if newline < 0:
                    if len(buf) - pos <= RECORD_LIMIT:
                        break
                    newline = len(buf) - 1  # too long: not a record after all
                event = parse_record(buf[pos:newline], self.rank)
                out.append(event if event is not None else self._raw(buf[pos:newline + 1]))
                pos = newline + 1
            elif len(buf) - pos < len(MAGIC) and MAGIC.startswith(buf[pos:]):
                break  # maybe the start of a record
            else:
                if newline < 0 and self.rank is None and len(buf) - pos <= TEXT_LIMIT:
                    break  # the launcher's own text goes on by whole lines
                end = len(buf) if newline < 0 else newline + 1
                out.append(self._raw(buf[pos:end]))
                pos = end
        self._pending = buf[pos:]
        return out

    def _raw(self, data: bytes) -> Piece:
        return Piece(self.rank, self.stream, data)

    def flush(self) -> list[Event]:
        rest, self._pending = self._pending, b""
        return [self._raw(rest)] if rest else []


@dataclass
class TagSplitter:
    """Cuts Open MPI's `--tag-output` stream into (tag, bytes) pieces; tag None: untagged."""

    _pending: bytes = b""
    _current: tuple[int, str] | None = None  # the tag whose piece runs on; None: line start

    def feed(self, data: bytes) -> list[tuple[tuple[int, str] | None, bytes]]:
        buf = self._pending + data if self._pending else data
        out: list[tuple[tuple[int, str] | None, bytes]] = []
        pos = 0
        while pos < len(buf):
            if self._current is None:
                match = TAG_RE.match(buf, pos)
                if match is not None:
                    stream = "stdout" if match.group(3) == b"stdout" else "stderr"
                    self._current = (int(match.group(2)), stream)
                    pos = match.end()
                    continue
                if _TAG_START_RE.match(buf, pos) and len(buf) - pos < 40:
                    break
                newline = buf.find(b"\n", pos)
                if newline < 0:
                    if len(buf) - pos > TEXT_LIMIT:
                        out.append((None, buf[pos:]))
                        pos = len(buf)
                    break
                out.append((None, buf[pos:newline + 1]))
                pos = newline + 1
                continue
            end, wait = self._piece_end(buf, pos)
            if end > pos:
                out.append((self._current, buf[pos:end]))
            pos = end
            if wait:
                break
            if buf[end - 1:end] == b"\n":
                self._current = None
            elif end < len(buf):
                self._current = None  # a tag follows; it is read at the loop's top
        self._pending = buf[pos:]
        return out

    @staticmethod
    def _piece_end(buf: bytes, pos: int) -> tuple[int, bool]:
        """Where the current piece ends: after its newline, at the next tag, or at the end of
        the buffer (then True when what follows may be the start of a tag)."""
        newline = buf.find(b"\n", pos)
        limit = len(buf) if newline < 0 else newline + 1
        bracket = buf.find(b"[", pos, limit)
        while bracket >= 0:
            if TAG_RE.match(buf, bracket):
                return bracket, False
            if _TAG_START_RE.match(buf, bracket) and len(buf) - bracket < 40:
                return bracket, True
            bracket = buf.find(b"[", bracket + 1, limit)
        return limit, False

    def flush(self) -> list[tuple[tuple[int, str] | None, bytes]]:
        rest, self._pending = self._pending, b""
        return [(self._current, rest)] if rest else []


@dataclass
class OpenMpiDemux:
    """mpirun's stdout or stderr (one instance each): tags, then each rank's records."""

    stream: str = "stdout"
    _tags: TagSplitter = field(default_factory=TagSplitter)
    _records: dict[tuple[int, str], RecordParser] = field(default_factory=dict)

    def feed(self, data: bytes) -> list[Event]:
        return self._take(self._tags.feed(data))

    def _take(self, pieces: list[tuple[tuple[int, str] | None, bytes]]) -> list[Event]:
        out: list[Event] = []
        for tag, data in pieces:
            if tag is None:
                out.append(Piece(None, self.stream, data))
                continue
            parser = self._records.get(tag)
            if parser is None:
                parser = self._records[tag] = RecordParser(tag[0], tag[1])
            out.extend(parser.feed(data))
        return out

    def flush(self) -> list[Event]:
        out = self._take(self._tags.flush())
        for parser in self._records.values():
            out.extend(parser.flush())
        return out


@dataclass
class RecordDemux:
    """A launcher that does not tag its ranks' output: records must arrive whole (each is one
    atomic write of at most PIPE_BUF bytes); anything else is the launcher's own text."""

    stream: str = "stdout"
    _records: RecordParser = field(default_factory=RecordParser)

    def __post_init__(self) -> None:
        self._records.stream = self.stream

    def feed(self, data: bytes) -> list[Event]:
        return self._records.feed(data)

    def flush(self) -> list[Event]:
        return self._records.flush()
