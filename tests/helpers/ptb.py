"""Where the tests find the Penn Treebank files: the variable the quick start sets too."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from dtlaunch.examples.ptb_lm import data

REPO = Path(__file__).resolve().parents[2]
DATA_ENV = "DTLAUNCH_PTB_DATA"


def find_ptb() -> Path:
    """``$DTLAUNCH_PTB_DATA``, else ``data/ptb`` in the checkout, else the shared data beside it."""
    candidates = [REPO / "data" / "ptb", REPO.parent / "shared" / "data" / "ptb"]
    if os.environ.get(DATA_ENV):
        candidates.insert(0, Path(os.environ[DATA_ENV]))
    for d in candidates:
        if all((d / name).is_file() for name in data.FILES.values()):
            return d
    return candidates[0]


PTB_DIR = find_ptb()
HAVE_PTB = all((PTB_DIR / name).is_file() for name in data.FILES.values())
# A skip outside CI; under CI=true the suite turns it into a failure (see conftest).
needs_ptb = pytest.mark.skipif(not HAVE_PTB, reason=f"PTB files not found in {PTB_DIR} (set {DATA_ENV})")


def mpirun_command(np_: int) -> list[str]:
    """The example under a hand-written local mpirun, as Horovod's own recipes start it."""
    return ["mpirun", "--allow-run-as-root", "-np", str(np_), "-bind-to", "none",
            "-map-by", "slot", "-mca", "pml", "ob1", "-mca", "btl", "self,vader,tcp",
            "-x", "PYTHONPATH", sys.executable, "-m", "dtlaunch.examples.ptb_lm"]
