"""Shared fixtures. Test-bed tests skip only outside CI: with CI=true a missing piece fails."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from slurm_bed import SlurmCluster, missing_slurm, start_slurm_cluster
from testbed import TestBed, build_testbed, missing_requirements

IN_CI = os.environ.get("CI") == "true"
SCRIPTS = Path(__file__).parent / "scripts"


def _unavailable(why: str) -> None:
    if IN_CI:
        pytest.fail(f"required in CI: {why}")
    pytest.skip(why)


def require_testbed() -> None:
    why = missing_requirements()
    if why:
        _unavailable(why)


def require_horovod() -> None:
    if importlib.util.find_spec("horovod") is None or importlib.util.find_spec("torch") is None:
        _unavailable("Horovod with PyTorch is not installed (run the set-up script)")
    if shutil.which("mpirun") is None:
        _unavailable("mpirun is not installed")


@pytest.fixture(scope="session")
def bed() -> Iterator[TestBed]:
    """Three healthy hosts shared by tests that do not break them."""
    require_testbed()
    testbed = build_testbed(3)
    try:
        yield testbed
    finally:
        testbed.close()


@pytest.fixture
def make_bed() -> Iterator[Callable[..., TestBed]]:
    """A private bed for tests that break hosts (stop sshd, change keys, ...)."""
    require_testbed()
    beds: list[TestBed] = []

    def make(n: int = 2, **kwargs: object) -> TestBed:
        testbed = build_testbed(n, **kwargs)  # type: ignore[arg-type]
        beds.append(testbed)
        return testbed

    try:
        yield make
    finally:
        for testbed in beds:
            testbed.close()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real Slurm cluster (munged, slurmctld, one slurmd per host) over its own 3-host bed.

    Every test's tmp_path is visible on every node (the nodes have private /tmp otherwise).
    """
    require_testbed()
    why = missing_slurm()
    if why:
        _unavailable(why)
    testbed = build_testbed(3)
    try:
        cluster = start_slurm_cluster(testbed, shared=[tmp_path_factory.getbasetemp()])
        try:
            yield cluster
        finally:
            cluster.stop()
    finally:
        testbed.close()


@pytest.fixture
def horovod() -> None:
    require_horovod()


def dtlaunch_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "dtlaunch", *args]
