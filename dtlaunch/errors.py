"""One error hierarchy, caught once in the CLI and mapped to exit codes."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class DtlaunchError(Exception):
    """An expected failure: printed as one line, never as a traceback."""

    exit_code = EXIT_FAILURE


class UsageError(DtlaunchError):
    """Bad input from the user: nothing was run."""

    exit_code = EXIT_USAGE
