"""Intel MPI's own CPU binding, on the real Intel MPI (the intelmpi venv)."""

from __future__ import annotations

import os
import subprocess

import pytest
from helpers.mpi_envs import make_mpi_env


def cpu_set(text: str) -> set[int]:
    """A kernel CPU list ("0-1,4") as a set."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out |= set(range(int(lo), int(hi or lo) + 1))
    return out


@pytest.mark.testbed  # the intelmpi venv
@pytest.mark.parametrize("binding", ["-bind-to none", "-bind-to core"])
def test_intel_ranks_get_the_cpus_binding_args_asks_for(binding: str) -> None:
    """Measured on the real Intel MPI: before the translation both lines gave one CPU per rank."""
    intel = make_mpi_env("intelmpi")
    done = subprocess.run(intel.dtlaunch_argv("run", "--no-check", "-np", "2", "--binding-args",
                                              binding, "grep", "Cpus_allowed_list",
                                              "/proc/self/status"),
                          capture_output=True, text=True, timeout=120, env=intel.environ())
    assert done.returncode == 0, done.stderr
    cpus = [cpu_set(line.split()[-1]) for line in done.stdout.splitlines() if "Cpus_allowed" in line]
    assert len(cpus) == 2, done.stdout
    if binding == "-bind-to none":
        assert all(c == os.sched_getaffinity(0) for c in cpus), cpus
    else:
        assert all(len(c) == 1 for c in cpus) and cpus[0] != cpus[1], cpus
