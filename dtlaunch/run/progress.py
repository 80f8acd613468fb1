"""Progress while a job starts, as the library tells it through `on_event`: how many hosts the
pre-flight has checked, on how many hosts ranks are up, how many ranks are running. The CLI
draws it as one live line on a terminal (console/render.py), and nothing elsewhere."""

from __future__ import annotations

from dataclasses import dataclass

HOSTS_CHECKED = "hosts checked"  # the pre-flight's (and doctor's) probes answered
HOSTS_UP = "hosts up"  # hosts where a rank has started (its first record came)
RANKS_RUNNING = "ranks running"  # ranks whose program has started


@dataclass(frozen=True)
class Progress:
    stage: str
    done: int
    total: int
    # The start is over (every rank runs, or the job's own output has begun): the line goes,
    # so that it never mixes with the ranks' lines.
    final: bool = False
