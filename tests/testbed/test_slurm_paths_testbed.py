"""The Slurm test bed from a checkout, and a HOME, under /tmp (issue 27).

Each Slurm node has a private tmpfs /tmp (Slurm's PMIx plugin needs one per node); what a job
needs must be bound back in wherever it lives: the checkout (a job's steps start in the
submitting directory), the venvs and HOME's cache. This runs some of the Slurm tests again,
in a pytest of their own, from a copy of this checkout in a folder under /tmp with HOME under
/tmp too; before the fix every one of them failed ("couldn't chdir to <checkout>").
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers.slurm_bed import missing_slurm
from helpers.suite import REPO, require_testbed
from helpers.testbed import under_tmp

pytestmark = pytest.mark.testbed

SELECTED = (
    "tests/testbed/test_slurm_testbed.py::test_srun_probe_reaches_every_allocated_node_and_maps_answers",
    "tests/testbed/test_slurm_testbed.py::test_mpirun_starts_ranks_through_slurm_without_ssh",
    "tests/testbed/test_slurm_run_testbed.py::test_run_places_ranks_on_the_allocated_nodes_and_allreduces",
    "tests/testbed/test_slurm_run_testbed.py::test_submit_with_no_sbatch_options_runs_and_completes",
)


def copy_checkout(dest: Path) -> None:
    """This checkout's files as a clone would have them, plus uncommitted changes."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO,
                            capture_output=True, timeout=60)
    if listed.returncode != 0:  # not a git checkout: everything but the build outputs
        shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__"))
        return
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def test_under_tmp_keeps_the_outermost_folders_under_tmp(tmp_path: Path) -> None:
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    tmp = Path(os.path.realpath("/tmp"))
    rel = str(Path(os.path.realpath(tmp_path)).relative_to(tmp))
    assert under_tmp([inner, tmp_path, Path("/usr"), Path("/tmp"), tmp_path / "missing"]) == [rel]


def test_the_slurm_tests_pass_from_a_checkout_and_home_under_tmp(horovod: None) -> None:
    require_testbed()
    why = missing_slurm()
    if why:
        pytest.skip(why)
    with tempfile.TemporaryDirectory(prefix="dtl-checkout-", dir="/tmp") as where:
        root = Path(where)
        clone, home = root / "dtlaunch", root / "home"
        clone.mkdir()
        home.mkdir()
        copy_checkout(clone)
        env = {k: v for k, v in os.environ.items()
               if k not in ("XDG_CACHE_HOME", "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST")}
        env.update(HOME=str(home), PYTHONPATH=str(clone))  # dtlaunch from the copy
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             f"--basetemp={root / 'pytest'}", *SELECTED],
            cwd=clone, env=env, capture_output=True, text=True, timeout=900)
        tail = (proc.stdout + proc.stderr)[-4000:]
        assert proc.returncode == 0, tail
        assert f"{len(SELECTED)} passed" in proc.stdout, tail
