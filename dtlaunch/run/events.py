"""What a run tells its caller along the way: the events `on_event` gets (the CLI renders them).

Below the single run (`session.py`) and the restart loop (`restart_loop.py`) alike, so the
loop speaks the run's language without importing the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from dtlaunch.run.progress import Progress

if TYPE_CHECKING:
    from dtlaunch.run.failure_report import JobReport


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
