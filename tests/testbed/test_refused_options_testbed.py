"""Each real MPI launcher refusing an option: dtlaunch's last line names it and where it came
from (the words themselves are read in tests/unit/test_refused_options.py)."""

from __future__ import annotations

import subprocess

from helpers.mpi_envs import MpiEnv


def test_every_mpi_launcher_refusing_an_option_is_named_by_dtlaunch(mpi_env: MpiEnv) -> None:
    done = subprocess.run(mpi_env.dtlaunch_argv("run", "--no-check", "-np", "1",
                                                "--mpi-args", "-foo bar", "true"),
                          capture_output=True, text=True, timeout=120, env=mpi_env.environ())
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    launcher = "mpiexec" if mpi_env.id in ("mpich", "intelmpi") else "mpirun"
    assert last.startswith(f"dtlaunch: job failed: {launcher} does not take the option "), last
    assert "-foo" in last and last.endswith("it came from --mpi-args"), last
    assert "Traceback" not in done.stderr
