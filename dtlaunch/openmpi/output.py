"""Open MPI's `--tag-output` stream back into what each rank's shim sent (dtlaunch.core.records:
cut at its tags, `[JOB,RANK]<stdout>:`, each rank's pieces to that rank's record parser). Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dtlaunch.core import records
from dtlaunch.core.records import Event, PieceRouter, RecordParser, merged


class TagSplitter(records.TagSplitter):
    """Open MPI's `--tag-output` tags: (rank, stream)."""

    TAG = re.compile(rb"\[(\d+),(\d+)\]<(stdout|stderr|stddiag)>:")
    TAG_START = re.compile(rb"\[\d*(,\d*(\](<[a-z]{0,7}>?)?)?)?\Z")

    def tag(self, match: re.Match[bytes]) -> tuple[int, str]:
        return int(match.group(2)), "stdout" if match.group(3) == b"stdout" else "stderr"


@dataclass
class OpenMpiDemux:
    """mpirun's stdout or stderr (one instance each): tags, then each rank's records."""

    stream: str = "stdout"
    space_after_tag: bool = False  # Open MPI >= 5

    def __post_init__(self) -> None:
        self._tags = TagSplitter(self.space_after_tag)
        self._router = PieceRouter(self.stream, lambda tag: RecordParser(tag[0], tag[1]))

    def feed(self, data: bytes) -> list[Event]:
        return merged(self._router.take(self._tags.feed(data)))

    def flush(self) -> list[Event]:
        return self._router.flush(self._tags.flush())
