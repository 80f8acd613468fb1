"""Which MPI Horovod loaded, judged against the MPI that starts the job (pure)."""

from __future__ import annotations

import pytest

from dtlaunch.check.facts import PythonFacts
from dtlaunch.check.mpi_checks import LoadedMpi, check_horovod_mpi, library_mpi
from dtlaunch.check.report import FAIL, PASS, CheckResult
from dtlaunch.mpi import MpiImpl

OPEN_MPI, MPICH_ABI = ("Open MPI",), ("MPICH", "Intel MPI")


@pytest.mark.parametrize(("path", "expected"), [
    ("/usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4", LoadedMpi(OPEN_MPI, 4)),  # Debian's 4.1
    ("/opt/ompi-4.0.7/lib/libmpi.so.40.20.7", LoadedMpi(OPEN_MPI, 4)),
    ("/opt/ompi-5/lib/libmpi.so.40.40.1", LoadedMpi(OPEN_MPI, 5)),
    ("/opt/ompi-3/lib/libmpi.so.40.10.4", LoadedMpi(OPEN_MPI, 3)),
    ("/venv/lib/libmpi.so.40", LoadedMpi(OPEN_MPI)),  # PyPI's Open MPI 5: no version suffix
    ("/venv/lib/libmpi.so.12", LoadedMpi(MPICH_ABI)),  # MPICH, Intel MPI
    ("/usr/lib/x86_64-linux-gnu/libmpi.so.12.3.1", LoadedMpi(MPICH_ABI)),
    ("/usr/lib/libmpi.so.20", None),  # Open MPI 2: not judged
    ("/usr/lib/libmpi_cxx.so.40", None),
    ("", None),
])
def test_the_library_name_says_which_mpi(path: str, expected: object) -> None:
    assert library_mpi(path) == expected


OK = CheckResult("horovod", PASS, "0.28.1 (frameworks PyTorch; controllers MPI)")
OMPI4 = MpiImpl("Open MPI", "4.1.4")
OMPI5 = MpiImpl("Open MPI", "5.0.11")
MPICH = MpiImpl("MPICH", "5.0.2")
INTEL = MpiImpl("Intel MPI", "2021.19")


def judged(lib: str | None, mpi: MpiImpl | None, result: CheckResult = OK) -> CheckResult:
    py = PythonFacts(found=True, horovod_mpi_lib=lib)
    return check_horovod_mpi(result, py, mpi, "/x/bin/mpirun")


@pytest.mark.parametrize(("lib", "mpi"), [
    ("/usr/lib/libmpi.so.40.30.4", OMPI4),
    ("/venv/lib/libmpi.so.40", OMPI5),  # the family is all the name says: not refused
    ("/venv/lib/libmpi.so.40.40.1", OMPI5),
    ("/venv/lib/libmpi.so.12", MPICH),
    ("/venv/lib/libmpi.so.12", INTEL),
    (None, MPICH),  # not known (an old cache entry, no /proc): nothing claimed
    ("/usr/lib/libmpi.so.40.30.4", None),  # no MPI on the host: the MPI check says so
    ("/usr/lib/libmpi.so.40.30.4", MpiImpl("unknown", "")),
])
def test_a_matching_or_unknown_pair_passes(lib: str | None, mpi: MpiImpl | None) -> None:
    assert judged(lib, mpi) is OK


@pytest.mark.parametrize(("lib", "mpi", "loaded"), [
    ("/usr/lib/libmpi.so.40.30.4", MPICH, "Open MPI 4"),
    ("/usr/lib/libmpi.so.40.30.4", OMPI5, "Open MPI 4"),  # ORTE's libmpi under prterun
    ("/venv/lib/libmpi.so.40.40.1", OMPI4, "Open MPI 5"),
    ("/venv/lib/libmpi.so.40", INTEL, "Open MPI"),
    ("/venv/lib/libmpi.so.12", OMPI4, "MPICH or Intel MPI"),
])
def test_another_mpis_library_fails_with_the_rebuild(lib: str, mpi: MpiImpl, loaded: str) -> None:
    got = judged(lib, mpi)
    assert got.status == FAIL
    assert got.detail == (f"horovod loads {loaded} ({lib}), but the job runs "
                          f"{mpi.name} {mpi.version} (/x/bin/mpirun)")
    assert got.hint.endswith("dtlaunch install-horovod --mpi /x/bin/mpirun")


def test_a_horovod_check_that_failed_already_is_left_as_it_is() -> None:
    failed = CheckResult("horovod", FAIL, "import horovod fails: ...")
    assert judged("/usr/lib/libmpi.so.40.30.4", MPICH, failed) is failed
