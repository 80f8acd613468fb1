"""The settings the PTB example asks of the MPIs: filled in only where unset, and each one a name
that its MPI really reads (an MPI ignores a misspelt variable without a word)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers.mpi_envs import make_mpi_env

from dtlaunch.examples.ptb_lm import comm

# It asks the extra MPIs (their venvs) what they read.
pytestmark = pytest.mark.testbed


def test_defaults_fill_only_what_the_environment_lacks() -> None:
    environ = {"MPIR_CVAR_ALLGATHERV_PIPELINE_MSG_SIZE": "65536", "PATH": "/bin"}
    comm.apply_defaults(environ)
    assert environ["MPIR_CVAR_ALLGATHERV_PIPELINE_MSG_SIZE"] == "65536"  # the user's wins
    assert environ["MPIR_CVAR_CH4_PROGRESS_THROTTLE"] == "1"
    assert environ["HOROVOD_FUSION_THRESHOLD"] == "0"
    assert environ["PATH"] == "/bin"
    assert set(comm.DEFAULTS) <= set(environ)


def _without_defaults(environ: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k not in comm.DEFAULTS}


def _mpich_cvars(environ: dict[str, str]) -> dict[str, str]:
    """MPICH's control variables as its library reads them (mpivars asks through MPI_T)."""
    mpich = make_mpi_env("mpich")
    assert mpich.bin_dir is not None
    done = subprocess.run([mpich.launcher, "-n", "1", str(Path(mpich.bin_dir) / "mpivars")],
                          capture_output=True, text=True, timeout=120, env=environ)
    assert done.returncode == 0, done.stderr
    out = {}
    for line in done.stdout.splitlines():
        name, eq, rest = line.strip().partition("=")
        if eq and name.startswith("MPIR_CVAR_"):
            out[name.strip()] = rest.split("\t", 1)[0]  # names are padded to a column
    return out


def test_mpich_reads_each_of_the_examples_mpich_settings() -> None:
    mpich = make_mpi_env("mpich")
    stock = _without_defaults(mpich.environ())
    tuned = dict(stock)
    comm.apply_defaults(tuned)
    before, after = _mpich_cvars(stock), _mpich_cvars(tuned)
    names = [name for name in comm.DEFAULTS if name.startswith("MPIR_CVAR_")]
    assert names
    for name in names:
        assert after.get(name) == comm.DEFAULTS[name], name
        assert before.get(name) != comm.DEFAULTS[name], f"{name} is MPICH's default already"


@pytest.mark.parametrize("name", ["openmpi4", "openmpi5"])
def test_each_open_mpi_reads_the_examples_open_mpi_setting(name: str) -> None:
    ompi = make_mpi_env(name)
    info = str(Path(ompi.launcher).with_name("ompi_info"))
    environ = _without_defaults(ompi.environ())
    comm.apply_defaults(environ)
    done = subprocess.run([info, "--param", "mpi", "all", "--level", "9", "--parsable"],
                          capture_output=True, text=True, timeout=120, env=environ)
    assert done.returncode == 0, done.stderr
    lines = set(done.stdout.splitlines())
    assert "mca:mpi:base:param:mpi_yield_when_idle:value:true" in lines
    assert "mca:mpi:base:param:mpi_yield_when_idle:source:environment" in lines
