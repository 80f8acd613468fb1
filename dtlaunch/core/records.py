"""Read the launcher's output back into what each rank wrote. Pure code, bytes in, events out.

Every rank runs through dtlaunch.agents.rank_shim, which writes records (`\\x1edtl2 RANK KIND ESCAPED\\n`,
see there) to the stdout the MPI collects. Open MPI's `--tag-output` then tags every chunk it
forwards, not every line: a record split by its I/O layer arrives as
`[1,0]<stdout>:\\x1edtl2 0 o ab[1,1]<stdout>:...\\n[1,0]<stdout>:cd\\n`, interleaved with other
ranks' chunks. So the stream is cut at its tags, each rank's pieces are joined, and the joined
stream is cut into records; untagged text is the launcher's own message.

Tagged, a record's payload is passed on as its pieces come (its header read, what follows up to
the newline is the rank's, unescaped piece by piece), so records may be of any size. A launcher
that does not tag must deliver each record whole; there a record is held until its newline, up
to a limit. Everything is linear in the input and holds at most a header per rank and stream (a
record up to its limit where records come whole), plus one line of the launcher's own text,
capped. Consecutive pieces of one rank from one read are passed on as one, so the cost per piece
that mpirun cuts stays out of the rest of dtlaunch.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

from dtlaunch.agents import ESC, EXIT, HEADER_MAX, HOST, MAGIC, NOSTART, PIPE_BUF, STDERR, STDOUT, unescape

HEADER_RE = re.compile(rb"\x1edtl2 (-?\d{1,18}) ([a-z]) ")
TEXT_LIMIT = 64 * 1024  # a line of the launcher's own text longer than this is passed on in pieces
RECORD_LIMIT = PIPE_BUF  # where records come whole: more than this without a newline is not one
META_LIMIT = 2 * PIPE_BUF  # a host, exit or not-started record longer than this is not one


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
    # When the program ended (time.time() on its host), where the shim said: the record reads
    # `exit 3 @1700000000.125`. Not compared: it is a measurement, not what happened.
    at: float | None = field(default=None, compare=False)


@dataclass(frozen=True)
class RankNotStarted:
    rank: int
    program: str  # could not be run there: missing or not executable


Event = Union[Piece, RankHost, RankExit, RankNotStarted]
_STREAMS = {STDOUT: "stdout", STDERR: "stderr"}


def _event(rank: int, kind: str, payload: bytes) -> Event | None:
    if kind in _STREAMS:
        return Piece(rank, _STREAMS[kind], payload)
    if kind == HOST:
        return RankHost(rank, payload.decode("utf-8", "replace"))
    if kind == EXIT:
        how, _, when = payload.decode("ascii", "replace").partition(" @")
        return RankExit(rank, how, _seconds(when))
    if kind == NOSTART:
        return RankNotStarted(rank, payload.decode("utf-8", "replace"))
    return None


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and 0 < value < 1e11 else None  # not nan, not absurd


def parse_record(line: bytes, default_rank: int | None) -> Event | None:
    """One whole record without its newline, or None when the line is not one."""
    match = HEADER_RE.match(line)
    if match is None or b"\n" in line:
        return None
    rank = _rank(match, default_rank)
    if rank is None:
        return None
    return _event(rank, match.group(2).decode("ascii"), unescape(line[match.end():]))


def _rank(match: re.Match[bytes], default_rank: int | None) -> int | None:
    rank = int(match.group(1))
    return rank if rank >= 0 else default_rank


def _could_be_header(data: bytes) -> bool:
    """True when `data` (no newline, shorter than a header) may still grow into one."""
    if len(data) <= len(MAGIC):
        return MAGIC.startswith(data)
    return data.startswith(MAGIC) and re.fullmatch(rb"-?\d{0,18}( [a-z]?)?", data[len(MAGIC):]) is not None


@dataclass
class RecordParser:
    """Cuts one source's byte stream into records. What is not a record is passed on as raw
    bytes: a rank's (rank set, e.g. a traceback of the shim's own interpreter) or the
    launcher's (rank None).

    `whole` None: the source is one rank's (tagged): a record's payload goes on as it comes.
    `whole` N: a launcher that does not tag its ranks' output; records come whole (each one
    atomic write of at most N bytes, the shim's `record_limit`) and are held until their
    newline; anything else is the launcher's own text."""

    rank: int | None = None  # the source's rank when the launcher told it (a tag)
    stream: str = "stdout"
    whole: int | None = None
    _pending: bytes = b""
    _open: tuple[int, str] | None = None  # (rank, stream) of the record whose payload runs on
    _in_line: bool = False  # a line of raw text was passed on in part: the rest is raw too

    def feed(self, data: bytes) -> list[Event]:
        buf = self._pending + data if self._pending else data
        out: list[Event] = []
        pos = 0
        newline = -2  # where the next newline is (-1: none in buf); found again once passed
        size = len(buf)
        while pos < size:
            if newline != -1 and newline < pos:
                newline = buf.find(b"\n", pos)
            if self._open is not None:
                end = size if newline < 0 else newline
                if newline < 0 and buf[end - 1:end] == ESC:
                    end -= 1  # an escape pair cut in two: wait for its second byte
                if end > pos:
                    out.append(Piece(self._open[0], self._open[1], unescape(buf[pos:end])))
                pos = end
                if newline < 0:
                    break
                self._open = None
                pos += 1
                continue
            if not self._in_line and buf[pos] == MAGIC[0]:
                match = HEADER_RE.match(buf, pos)
                if match is None:
                    if newline < 0 and size - pos < HEADER_MAX and _could_be_header(buf[pos:]):
                        break  # maybe the start of a record
                else:
                    rank, kind = _rank(match, self.rank), match.group(2).decode("ascii")
                    if rank is not None and self.whole is None and kind in _STREAMS:
                        self._open = (rank, _STREAMS[kind])
                        pos = match.end()
                        continue
                    limit = self.whole or META_LIMIT
                    if newline < 0 and size - pos <= limit:
                        break  # the rest of the record is still to come
                    if newline >= 0 and newline - pos <= limit:
                        event = parse_record(buf[pos:newline], self.rank)
                        out.append(event if event is not None else self._raw(buf[pos:newline + 1]))
                        pos = newline + 1
                        continue
                    # too long: not a record after all
            if newline < 0 and self.rank is None and size - pos <= TEXT_LIMIT and not self._in_line:
                break  # the launcher's own text goes on by whole lines
            end = size if newline < 0 else newline + 1
            out.append(self._raw(buf[pos:end]))
            pos = end
            self._in_line = newline < 0
        self._pending = buf[pos:]
        return out

    def _raw(self, data: bytes) -> Piece:
        return Piece(self.rank, self.stream, data)

    def flush(self) -> list[Event]:
        rest, self._pending = self._pending, b""
        self._in_line = False
        if self._open is not None:
            return [Piece(self._open[0], self._open[1], unescape(rest))] if rest else []
        return [self._raw(rest)] if rest else []


def merged(events: list[Event]) -> list[Event]:
    """Consecutive pieces of one rank and stream as one piece."""
    out: list[Event] = []
    for key, group in itertools.groupby(events, key=_rank_stream):
        found = list(group)
        if key is None or len(found) == 1:
            out += found
        else:
            out.append(Piece(*key, b"".join(p.data for p in found if isinstance(p, Piece))))
    return out


def _rank_stream(event: Event) -> tuple[int, str] | None:
    """What a rank's piece merges by; None for any other event (never merged)."""
    return (event.rank, event.stream) if isinstance(event, Piece) and event.rank is not None else None


@dataclass
class TagSplitter:
    """Cuts a launcher's tagged stream into (tag, bytes) pieces; tag None: untagged. A launcher's
    subclass says what a tag is (TAG), what may still grow into one when more bytes come
    (TAG_START) and which tag a match is (`tag`)."""

    TAG: ClassVar[re.Pattern[bytes]]
    TAG_START: ClassVar[re.Pattern[bytes]]
    # Open MPI >= 5 (PRRTE) writes one space after every tag (`[1,0]<stdout>: `); before 5
    # there is none, and a space there is the rank's own.
    space_after_tag: bool = False
    _pending: bytes = b""
    _current: Any = None  # the tag whose piece runs on; None: line start

    def tag(self, match: re.Match[bytes]) -> Any: ...

    def feed(self, data: bytes) -> list[tuple[Any, bytes]]:
        buf = self._pending + data if self._pending else data
        out: list[tuple[Any, bytes]] = []
        pos = 0
        size = len(buf)
        # The next newline and `[` at or after pos (-1: none in buf), searched again only once
        # passed: each byte is looked at a bounded number of times.
        newline = bracket = -2
        while pos < size:
            if newline != -1 and newline < pos:
                newline = buf.find(b"\n", pos)
            if self._current is None:
                match = self.TAG.match(buf, pos)
                if match is not None:
                    end = match.end()
                    if self.space_after_tag:
                        if end >= len(buf):
                            break  # the tag's own space may still come
                        end += buf[end:end + 1] == b" "
                    self._current = self.tag(match)
                    pos = end
                    continue
                if self.TAG_START.match(buf, pos) and size - pos < 40:
                    break
                if newline < 0:
                    if size - pos > TEXT_LIMIT:
                        out.append((None, buf[pos:]))
                        pos = size
                    break
                out.append((None, buf[pos:newline + 1]))
                pos = newline + 1
                continue
            # The current piece ends after its newline, at the next tag, or at the buffer's end
            # (where it waits when what follows may be the start of a tag).
            limit = size if newline < 0 else newline + 1
            end, wait = limit, False
            while True:
                if bracket != -1 and bracket < pos:
                    bracket = buf.find(b"[", pos)
                if bracket < 0 or bracket >= limit:
                    break
                if self.TAG.match(buf, bracket):
                    end = bracket
                    break
                if self.TAG_START.match(buf, bracket) and size - bracket < 40:
                    end, wait = bracket, True
                    break
                bracket = buf.find(b"[", bracket + 1)
            if end > pos:
                out.append((self._current, buf[pos:end]))
            pos = end
            if wait:
                break
            if buf[end - 1:end] == b"\n" or end < size:
                self._current = None  # a line ended, or a tag follows (read at the loop's top)
        self._pending = buf[pos:]
        return out

    def flush(self) -> list[tuple[Any, bytes]]:
        rest, self._pending = self._pending, b""
        return [(self._current, rest)] if rest else []


@dataclass
class TaggedDemux:
    """A tagging launcher's stdout or stderr (one instance each): its tag splitter's pieces go
    to one RecordParser per tag (`new_parser(tag)`: the rank's, or the rank's and stream's);
    untagged pieces are the launcher's own text. Open MPI's in openmpi/output.py, Hydra's in
    hydra/output.py."""

    stream: str
    tags: TagSplitter
    new_parser: Callable[[Any], RecordParser]
    _parsers: dict[Any, RecordParser] = field(default_factory=dict)

    def feed(self, data: bytes) -> list[Event]:
        return merged(self._take(self.tags.feed(data)))

    def flush(self) -> list[Event]:
        out = self._take(self.tags.flush())
        for parser in self._parsers.values():
            out.extend(parser.flush())
        return out

    def _take(self, pieces: Sequence[tuple[Any, bytes]]) -> list[Event]:
        out: list[Event] = []
        # A launcher cuts a rank's output into chunks of a few KB: the rank's consecutive
        # chunks in this read go to its parser at once.
        for tag, group in itertools.groupby(pieces, key=lambda piece: piece[0]):
            if tag is None:
                out += [Piece(None, self.stream, data) for _, data in group]
                continue
            parser = self._parsers.get(tag)
            if parser is None:
                parser = self._parsers[tag] = self.new_parser(tag)
            out.extend(parser.feed(b"".join(data for _, data in group)))
        return out
