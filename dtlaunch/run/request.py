"""What one `dtlaunch run` asks: the plan's input and how to run it, built once from the
command line (console.run_args.config_from_args) or by a library caller, and handed whole to
run.session's `start` or `dry_run`. Data only: it imports nothing at run time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dtlaunch.plan.plan import RunRequest
    from dtlaunch.plan.rank_filter import RankFilter
    from dtlaunch.run.restarts import RestartPolicy


@dataclass(frozen=True)
class LaunchRequest:
    """A run: the plan's input, plus how to run it."""

    run: RunRequest
    check: bool = True  # run the pre-flight checks first
    timeout: float | None = None  # stop the whole job after this many seconds
    # When the job must be over (time.time()), where attempts share one --timeout (restarts):
    # the job then gets what is left of it when it starts, after the pre-flight.
    deadline: float | None = None
    # Under --max-restarts, "attempt 2 (DTLAUNCH_RESTART_COUNT=1)": each --output-dir log's
    # part of this attempt starts with a marker line naming it and the rank's host.
    log_label: str | None = None
    output_dir: str | None = None  # also write each rank's output to DIR/rank.N.log
    use_cache: bool = True  # False (--disable-cache): the full pre-flight checks every time
    start_timeout: float | None = None  # seconds each host's pre-flight checks may run
    prefix_timestamp: bool = False  # start each output line with the time it arrived
    ranks: RankFilter | None = None  # --ranks: the ranks the console shows (None: all)
    ranks_to_stderr: bool = False  # --json: stdout is the report's
    # --max-restarts: `start` runs the attempts under it (`launch` itself runs one attempt).
    restarts: RestartPolicy | None = None
    # Which attempt of the job this run is (0: the first; --max-restarts): DTLAUNCH_RESTART_COUNT,
    # and the count a kind of job that numbers its own restarts gives its ranks.
    attempt: int = 0
    max_restarts: int = 0  # how many restarts the job may have in all
