"""One error hierarchy, caught once in the CLI and mapped to exit codes."""

from __future__ import annotations

import signal

# dtlaunch's exit statuses, besides the job's own (which it passes on).
EXIT_OK = 0
EXIT_FAILURE = 1  # a check or the job failed
EXIT_USAGE = 2  # bad input: nothing was run
EXIT_TIMEOUT = 124  # the job ran longer than --timeout (as timeout(1) says it)


def exit_for_signal(signum: int) -> int:
    """The shell's convention for a run ended by a signal: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + signum


EXIT_INTERRUPTED = exit_for_signal(signal.SIGINT)  # 130


class DtlaunchError(Exception):
    """An expected failure: printed as one line, never as a traceback."""

    exit_code = EXIT_FAILURE


class UsageError(DtlaunchError):
    """Bad input from the user: nothing was run."""

    exit_code = EXIT_USAGE
