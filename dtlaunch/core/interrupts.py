"""SIGTERM and SIGHUP end dtlaunch the way Ctrl-C does: as an exception on the main thread.

Python's default for SIGTERM and SIGHUP is to die on the spot, skipping every `finally`: a
ProxyCommand started for a check (in its own session, so Ctrl-C reaches it only through us)
would be left running. Raised as `Interrupted`, they unwind like KeyboardInterrupt, and the
prober ends what it holds open.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from dtlaunch.core.errors import exit_for_signal


class Interrupted(BaseException):
    """A signal asked dtlaunch to stop. Not an Exception, so no `except Exception` keeps it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.exit_code = exit_for_signal(signum)


@contextmanager
def signals_raise() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise Interrupted (on the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
