"""What every test file may need about the suite itself: where the repository and the test
scripts are, how dtlaunch is started, and how a missing part is reported (a skip outside CI, a
failure under CI=true: see conftest.py)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

from helpers.testbed import missing_requirements

IN_CI = os.environ.get("CI") == "true"
REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "scripts"


def unavailable(why: str) -> None:
    pytest.skip(why)  # a failure under CI=true: see conftest.pytest_runtest_makereport


def require_testbed() -> None:
    why = missing_requirements()
    if why:
        unavailable(why)


def require_horovod() -> None:
    if importlib.util.find_spec("horovod") is None or importlib.util.find_spec("torch") is None:
        unavailable("Horovod with PyTorch is not installed (run the set-up script)")
    if shutil.which("mpirun") is None:
        unavailable("mpirun is not installed")


def dtlaunch_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "dtlaunch", *args]


def recording_thread_imports(log: Path) -> dict[str, str]:
    """Variables for a dtlaunch whose worker threads' first imports of a module are written
    to `log` (helpers/thread_imports/sitecustomize.py): the file must not exist afterwards."""
    return {"PYTHONPATH": f"{REPO / 'tests' / 'helpers' / 'thread_imports'}:{REPO}",
            "DTLAUNCH_TEST_THREAD_IMPORTS": str(log)}
