"""Reassemble mpirun's `--tag-output` stream into whole lines per rank. Pure code.

Open MPI tags every chunk a rank writes, not every line: an unbuffered `print("a", "b")` arrives
as `[1,0]<stdout>:a[1,0]<stdout>: [1,0]<stdout>:b\n`, interleaved with other ranks' chunks. So
each line mpirun prints is split at its tags and the pieces are appended to a buffer per rank
and stream; a line is emitted once that buffer holds a newline.

Open MPI 5 (PRRTE) writes its tag with one space after the colon (`[1,0]<stdout>: a`) on every
chunk; Open MPI 3 and 4 write none, so there a space after the tag is the rank's own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

TAG_RE = re.compile(r"\[(\d+),(\d+)\]<(stdout|stderr|stddiag)>:")


@dataclass(frozen=True)
class Line:
    rank: int | None  # None: mpirun's own message
    stream: str  # "stdout" or "stderr"
    text: str


@dataclass
class TagDemux:
    space_after_tag: bool = False  # Open MPI >= 5: the tag ends with one space of its own
    _partial: dict[tuple[int, str], str] = field(default_factory=dict)

    def feed(self, line: str, from_stderr: bool = False) -> list[Line]:
        """Take one line as mpirun printed it (newline included or not); return whole lines."""
        out: list[Line] = []
        first = TAG_RE.search(line)
        head = line if first is None else line[: first.start()]
        if head.strip("\r\n"):
            out.append(Line(None, "stderr" if from_stderr else "stdout", head.rstrip("\r\n")))
        if first is None:
            return out
        pieces = TAG_RE.split(line[first.start():])
        # split() yields ['', job, rank, stream, text, job, rank, stream, text, ...]
        for i in range(1, len(pieces), 4):
            rank, stream, text = int(pieces[i + 1]), pieces[i + 2], pieces[i + 3]
            if self.space_after_tag and text.startswith(" "):
                text = text[1:]
            key = (rank, "stderr" if stream == "stderr" else "stdout")
            buffered = self._partial.pop(key, "") + text
            *complete, rest = buffered.split("\n")
            out.extend(Line(rank, key[1], c.rstrip("\r")) for c in complete)
            if rest:
                self._partial[key] = rest
        return out

    def flush(self) -> list[Line]:
        """Whatever was left without a final newline when the job ended."""
        out = [Line(rank, stream, text) for (rank, stream), text in sorted(self._partial.items())]
        self._partial.clear()
        return out
