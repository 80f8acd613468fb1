"""What a prober or the SSH client still holds open, ended together on Ctrl-C or at a deadline.

Here, below both the probe layer and the SSH client, because both add to it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Protocol


class Closable(Protocol):
    def close(self) -> None: ...


class Tracker:
    """Things still open that must be ended on Ctrl-C or at a deadline. Once `close_all` ran,
    whatever is added is closed at once, and `close_all` waits (briefly) for processes being
    started right then: one started a moment before Ctrl-C must not outlive dtlaunch."""

    def __init__(self) -> None:
        self._items: set[Closable] = set()
        self._cond = threading.Condition()
        self._closed = False
        self._opening = 0

    @contextlib.contextmanager
    def opening(self) -> Iterator[None]:
        """Wraps starting a process until it is added, so close_all can wait for it."""
        with self._cond:
            self._opening += 1
        try:
            yield
        finally:
            with self._cond:
                self._opening -= 1
                self._cond.notify_all()

    def add(self, item: Closable) -> None:
        with self._cond:
            if not self._closed:
                self._items.add(item)
                return
        item.close()

    def discard(self, item: Closable) -> None:
        with self._cond:
            self._items.discard(item)

    def close_all(self) -> None:
        with self._cond:
            self._closed = True
            items = list(self._items)
            self._items.clear()
        for item in items:
            with contextlib.suppress(Exception):
                item.close()
        with self._cond:
            self._cond.wait_for(lambda: self._opening == 0, timeout=5.0)
