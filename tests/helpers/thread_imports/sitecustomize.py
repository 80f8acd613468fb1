"""Loaded at start-up by an interpreter given this folder on PYTHONPATH: every module imported
for the first time on a thread other than the main one is appended to the file named by
$DTLAUNCH_TEST_THREAD_IMPORTS ("thread name<TAB>module"). Two threads importing at once can
fail with _DeadlockError before Python 3.14 (CPython gh-83065), so dtlaunch's worker threads
must import nothing."""

from __future__ import annotations

import os
import sys
import threading

_PATH = os.environ.get("DTLAUNCH_TEST_THREAD_IMPORTS")


class _Recorder:
    """A finder that finds nothing: it only notes who asked, then lets the others look."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> None:
        thread = threading.current_thread()
        if _PATH and thread is not threading.main_thread() and name not in sys.modules:
            with open(_PATH, "a", encoding="utf-8") as out:
                out.write(f"{thread.name}\t{name}\n")
        return None


if _PATH:
    sys.meta_path.insert(0, _Recorder())
