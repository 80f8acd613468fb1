"""Open MPI's `--tag-output` stream back into what each rank's shim sent. Pure code.

mpirun tags every chunk it forwards, not every line (see dtlaunch.core.records): the stream is cut at
its tags (`[JOB,RANK]<stdout>:`; Open MPI 5 adds one space), each rank's pieces go to that
rank's record parser, and untagged text is mpirun's own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dtlaunch.core.records import TEXT_LIMIT, Event, PieceRouter, RecordParser, merged

TAG_RE = re.compile(rb"\[(\d+),(\d+)\]<(stdout|stderr|stddiag)>:")
# What may still grow into a tag when more bytes come.
_TAG_START_RE = re.compile(rb"\[\d*(,\d*(\](<[a-z]{0,7}>?)?)?)?\Z")


@dataclass
class TagSplitter:
    """Cuts Open MPI's `--tag-output` stream into (tag, bytes) pieces; tag None: untagged."""

    # Open MPI >= 5 (PRRTE) writes one space after every tag (`[1,0]<stdout>: `); before 5
    # there is none, and a space there is the rank's own.
    space_after_tag: bool = False
    _pending: bytes = b""
    _current: tuple[int, str] | None = None  # the tag whose piece runs on; None: line start

    def feed(self, data: bytes) -> list[tuple[tuple[int, str] | None, bytes]]:
        buf = self._pending + data if self._pending else data
        out: list[tuple[tuple[int, str] | None, bytes]] = []
        pos = 0
        size = len(buf)
        # The next newline and `[` at or after pos (-1: none in buf), searched again only once
        # passed: each byte is looked at a bounded number of times.
        newline = bracket = -2
        while pos < size:
            if newline != -1 and newline < pos:
                newline = buf.find(b"\n", pos)
            if self._current is None:
                match = TAG_RE.match(buf, pos)
                if match is not None:
                    end = match.end()
                    if self.space_after_tag:
                        if end >= len(buf):
                            break  # the tag's own space may still come
                        end += buf[end:end + 1] == b" "
                    stream = "stdout" if match.group(3) == b"stdout" else "stderr"
                    self._current = (int(match.group(2)), stream)
                    pos = end
                    continue
                if _TAG_START_RE.match(buf, pos) and size - pos < 40:
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
                if TAG_RE.match(buf, bracket):
                    end = bracket
                    break
                if _TAG_START_RE.match(buf, bracket) and size - bracket < 40:
                    end, wait = bracket, True
                    break
                bracket = buf.find(b"[", bracket + 1)
            if end > pos:
                out.append((self._current, buf[pos:end]))
            pos = end
            if wait:
                break
            if buf[end - 1:end] == b"\n":
                self._current = None
            elif end < size:
                self._current = None  # a tag follows; it is read at the loop's top
        self._pending = buf[pos:]
        return out

    def flush(self) -> list[tuple[tuple[int, str] | None, bytes]]:
        rest, self._pending = self._pending, b""
        return [(self._current, rest)] if rest else []


@dataclass
class OpenMpiDemux:
    """mpirun's stdout or stderr (one instance each): tags, then each rank's records."""

    stream: str = "stdout"
    space_after_tag: bool = False  # Open MPI >= 5
    _tags: TagSplitter = field(default_factory=TagSplitter)

    def __post_init__(self) -> None:
        self._tags.space_after_tag = self.space_after_tag
        self._router = PieceRouter(self.stream, lambda tag: RecordParser(tag[0], tag[1]))

    def feed(self, data: bytes) -> list[Event]:
        return merged(self._router.take(self._tags.feed(data)))

    def flush(self) -> list[Event]:
        return self._router.flush(self._tags.flush())
