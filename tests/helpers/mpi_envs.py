"""One MPI installation per test parameter: the system's Open MPI 4 and the venvs of Open
MPI 5, MPICH and Intel MPI that scripts/setup_mpis.sh makes, each with Horovod built against it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from helpers.suite import REPO, unavailable

MPI_VENVS = Path(os.environ.get("DTLAUNCH_MPI_VENVS")
                 or Path.home() / ".cache" / "dtlaunch" / "mpi-venvs")


@dataclass(frozen=True)
class MpiEnv:
    """One MPI installation with its own Python, torch and Horovod built against it.

    openmpi4: the system's (Debian's) Open MPI with the interpreter running the tests;
    openmpi5, mpich, intelmpi: PyPI's wheels in the venvs that scripts/setup_mpis.sh makes."""

    id: str
    python: str
    bin_dir: str | None  # first on PATH; None: the system's MPI on the unchanged PATH
    launcher: str  # absolute path of mpirun / mpiexec

    def environ(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.bin_dir is not None:
            env["PATH"] = os.pathsep.join([self.bin_dir, env.get("PATH", os.defpath)])
        # dtlaunch from this checkout, whichever checkout the venv was installed from.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        return env

    def dtlaunch_argv(self, *args: str) -> list[str]:
        return [self.python, "-m", "dtlaunch", *args]


# id -> (venv under MPI_VENVS or None for the system's, launcher name)
MPI_ENVS = {"openmpi4": (None, "mpirun"), "openmpi5": ("openmpi5", "mpirun"),
            "mpich": ("mpich", "mpiexec"), "intelmpi": ("intelmpi", "mpiexec")}
# The Open MPIs, which the suite of tests/testbed/test_mpis_testbed.py runs `dtlaunch run` with; the
# Hydra MPIs (MPICH, Intel MPI) have theirs in tests/testbed/test_hydra_testbed.py (`hydra_mpi`).
DTLAUNCH_RUN_MPIS = ("openmpi4", "openmpi5")


def _horovod_imports(python: str, env: dict[str, str]) -> str | None:
    code = "import horovod.torch as h; raise SystemExit(0 if h.mpi_built() else 3)"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    if done.returncode == 0:
        return None
    tail = (done.stderr.strip().splitlines() or ["Horovod was built without MPI"])[-1]
    return tail


def make_mpi_env(name: str) -> MpiEnv:
    venv, launcher = MPI_ENVS[name]
    if venv is None:
        found = shutil.which(launcher)
        if found is None:
            unavailable(f"{name}: {launcher} is not on PATH (run ./quickstart.sh setup)")
        env = MpiEnv(name, sys.executable, None, str(found))
    else:
        folder = MPI_VENVS / venv
        python, program = folder / "bin" / "python", folder / "bin" / launcher
        if not (python.exists() and program.exists()):
            unavailable(f"{name}: no venv with {launcher} at {folder} (run ./quickstart.sh "
                         "setup, which runs scripts/setup_mpis.sh)")
        env = MpiEnv(name, str(python), str(folder / "bin"), str(program))
    why = _horovod_imports(env.python, env.environ())
    if why:
        unavailable(f"{name}: Horovod does not import with MPI for {env.python}: {why} "
                     "(run scripts/setup_mpis.sh)")
    return env
