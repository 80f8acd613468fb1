"""Is Horovod on a host built for the MPI the job runs with? Pure.

Horovod links one MPI library at build time. Started by another MPI's launcher it fails in
`hvd.init()` or hangs (Open MPI's libmpi under MPICH's Hydra, or Open MPI 4's libmpi under
Open MPI 5's prterun), an error that names neither MPI. The probe records the libmpi file that
`import horovod.torch` loaded; its name carries the ABI: libmpi.so.12 for the MPICH family
(MPICH, Intel MPI), libmpi.so.40.N for Open MPI 3.0 and later, where libtool's N is 0-10 for
3.x, 20-30 for 4.x and 40 for 5.x.
"""

from __future__ import annotations

import posixpath
import re

from dtlaunch.check.facts import PythonFacts
from dtlaunch.check.report import FAIL, PASS, CheckResult
from dtlaunch.mpi import MpiImpl

OPEN_MPI, MPICH_FAMILY = "Open MPI", "MPICH family"
_SONAME = re.compile(r"libmpi\.so\.(\d+)(?:\.(\d+))?(?:\.\d+)*")


def library_mpi(path: str) -> tuple[str, int | None] | None:
    """(family, Open MPI's major version or None) from a libmpi file's name; None: unknown."""
    match = _SONAME.fullmatch(posixpath.basename(path))
    if match is None:
        return None
    if match.group(1) == "40":
        age = int(match.group(2)) if match.group(2) else None
        return OPEN_MPI, None if age is None else 5 if age >= 40 else 4 if age >= 20 else 3
    if match.group(1) == "12":
        return MPICH_FAMILY, None
    return None


def _matches(lib: tuple[str, int | None], mpi: MpiImpl) -> bool:
    family, major = lib
    if mpi.is_open_mpi:
        return family == OPEN_MPI and (major is None or not mpi.release or major == mpi.release[0])
    if mpi.is_hydra:
        return family == MPICH_FAMILY
    return True  # an MPI this module cannot judge


def check_horovod_mpi(result: CheckResult, py: PythonFacts, mpi: MpiImpl | None,
                      mpirun: str) -> CheckResult:
    """The host's horovod check, failed when Horovod loads another MPI than `mpi`, the one
    whose launcher (`mpirun`) starts the job there."""
    if result.status != PASS or not py.horovod_mpi_lib or mpi is None:
        return result
    lib = library_mpi(py.horovod_mpi_lib)
    if lib is None or _matches(lib, mpi):
        return result
    family, major = lib
    loaded = f"Open MPI {major}" if family == OPEN_MPI and major else (
        "Open MPI" if family == OPEN_MPI else "an MPICH-family MPI (MPICH, Intel MPI)")
    runs = f"{mpi.name} {mpi.version}".strip()
    return CheckResult(
        "horovod", FAIL,
        f"horovod loads {loaded} ({py.horovod_mpi_lib}), but the job runs {runs} ({mpirun})",
        f"build Horovod against the job's MPI, with its bin directory first on PATH: "
        f"dtlaunch install-horovod --mpi {mpirun or 'PATH/TO/mpirun'}")
