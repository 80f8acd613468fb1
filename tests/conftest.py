"""Shared fixtures and suite-wide rules.

Outside CI a test whose part is missing (the test bed, Horovod, the PTB data, an MPI venv) is
skipped; with CI=true every skip is a failure, so a green CI means every test ran."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent))

from helpers.mpi_envs import DTLAUNCH_RUN_MPIS, MPI_ENVS, MpiEnv, make_mpi_env
from helpers.slurm_bed import SlurmCluster, missing_slurm, start_slurm_cluster
from helpers.suite import IN_CI, require_horovod, require_testbed, unavailable
from helpers.testbed import TestBed, build_testbed

# A test run started in the background by a non-interactive shell (`.ci/run &`, a CI step)
# inherits SIGINT and SIGQUIT ignored, and every process it starts inherits that too: dtlaunch
# then rightly keeps ignoring them, as a background job must, and the tests that stop it the
# way a terminal does would wait for nothing. Exec resets handled signals to their defaults.
for _signum, _handler in ((signal.SIGINT, signal.default_int_handler),
                          (signal.SIGQUIT, signal.SIG_DFL)):
    if signal.getsignal(_signum) == signal.SIG_IGN:
        signal.signal(_signum, _handler)
# A run stopped with SIGTERM (a CI time limit, `kill`) stops as Ctrl-C stops it: pytest then
# runs the fixtures' teardown, so the test beds (namespaces, sshd, Slurm daemons) go too.
signal.signal(signal.SIGTERM, signal.default_int_handler)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under CI=true a skip, whatever raised it, fails the test: skipped is not passed."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where every test must run: {reason}"


# Markers follow from what a test uses, so `-m "not testbed"` never needs root or an MPI venv
# and every test that needs Horovod is marked, whoever forgets a decorator.
TESTBED_FIXTURES = frozenset({"bed", "make_bed", "dbed", "slurm_cluster", "mpi_env", "run_mpi_env",
                              "hydra_mpi", "mpich_env"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    misplaced = []
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        folder = item.path.parent.name
        if (used & TESTBED_FIXTURES or folder == "testbed") and item.get_closest_marker("testbed") is None:
            item.add_marker(pytest.mark.testbed)
        if folder == "unit" and item.get_closest_marker("testbed") is not None:
            misplaced.append(item.nodeid)
        if "horovod" in used and item.get_closest_marker("horovod") is None:
            item.add_marker(pytest.mark.horovod)
    if misplaced:  # tests/unit/ runs without root, namespaces, sshd, Slurm or the MPI venvs
        raise pytest.UsageError("these tests need the test bed; move them to tests/testbed/: "
                                + ", ".join(misplaced))


# One profile for every property test: a loaded machine is slow, not wrong.
settings.register_profile("dtlaunch", deadline=None)
settings.load_profile("dtlaunch")


@pytest.fixture(scope="session")
def bed() -> Iterator[TestBed]:
    """Three healthy hosts shared by tests that do not break them."""
    yield from _bed(names_resolve=False)


@pytest.fixture(scope="module")
def resolving_bed() -> Iterator[TestBed]:
    """Three hosts that resolve each other's names, as a cluster's nodes do (Horovod's Gloo
    process sets look up the host's own name); one per test module, which may break them."""
    yield from _bed(names_resolve=True)


def _bed(names_resolve: bool) -> Iterator[TestBed]:
    require_testbed()
    testbed = build_testbed(3, names_resolve=names_resolve)
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
        unavailable(why)
    testbed = build_testbed(3, names_resolve=True)  # Gloo ranks resolve their own name
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


@pytest.fixture(params=list(MPI_ENVS), scope="session")
def mpi_env(request: pytest.FixtureRequest) -> MpiEnv:
    """Every MPI the test bed runs: Open MPI 4 (system), Open MPI 5, MPICH, Intel MPI (venvs)."""
    return make_mpi_env(request.param)


@pytest.fixture(params=DTLAUNCH_RUN_MPIS, scope="session")
def run_mpi_env(request: pytest.FixtureRequest) -> MpiEnv:
    """The MPIs that `dtlaunch run` launches with."""
    return make_mpi_env(request.param)
