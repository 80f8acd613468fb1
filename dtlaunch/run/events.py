"""What a run tells its caller along the way: the events `on_event` gets (the CLI renders them).

Below the single run (`session.py`) and the restart loop (`restarts.py`) alike, so the
loop speaks the run's language without importing the run. Among them, progress while a job
starts: how many hosts the pre-flight has checked, on how many hosts ranks are up, how many
ranks are running; the CLI draws it as one live line on a terminal, and nothing elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dtlaunch.run.failure_report import JobReport

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


class EventLevel(Enum):
    NOTE = "note"  # always shown
    WARNING = "warning"  # always shown, as a warning
    DETAIL = "detail"  # shown with --verbose
    PROGRESS = "progress"  # a job starting: a live line on a terminal, else nothing
    REPORT = "report"  # how an attempt of a --max-restarts job ended (root cause first)


@dataclass(frozen=True)
class Event:
    level: EventLevel
    text: str
    progress: Progress | None = None  # with PROGRESS
    report: JobReport | None = None  # with REPORT


def progress_event(progress: Progress) -> Event:
    return Event(EventLevel.PROGRESS, f"{progress.stage} {progress.done}/{progress.total}",
                 progress)


OnEvent = Callable[[Event], None]
