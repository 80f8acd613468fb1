"""Open MPI's `--tag-output` stream back into what each rank's shim sent (dtlaunch.core.records:
cut at its tags, `[JOB,RANK]<stdout>:`, each rank's pieces to that rank's record parser). Pure."""

from __future__ import annotations

import re

from dtlaunch.core import records
from dtlaunch.core.records import RecordParser, TaggedDemux


class TagSplitter(records.TagSplitter):
    """Open MPI's `--tag-output` tags: (rank, stream)."""

    TAG = re.compile(rb"\[(\d+),(\d+)\]<(stdout|stderr|stddiag)>:")
    TAG_START = re.compile(rb"\[\d*(,\d*(\](<[a-z]{0,7}>?)?)?)?\Z")

    def tag(self, match: re.Match[bytes]) -> tuple[int, str]:
        return int(match.group(2)), "stdout" if match.group(3) == b"stdout" else "stderr"


class OpenMpiDemux(TaggedDemux):
    """mpirun's stdout or stderr (one instance each): tags, then each rank's records."""

    def __init__(self, stream: str = "stdout", space_after_tag: bool = False) -> None:
        # space_after_tag: Open MPI >= 5.
        super().__init__(stream, TagSplitter(space_after_tag),
                         lambda tag: RecordParser(tag[0], tag[1]))
