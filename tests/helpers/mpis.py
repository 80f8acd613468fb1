"""Intel MPI's banner, fake MPI launchers and a JobSpec builder, shared by the Hydra and Intel MPI tests."""

from __future__ import annotations

from pathlib import Path

from dtlaunch.job.env import EnvPlan, EnvVar
from dtlaunch.job.hosts import Host
from dtlaunch.mpi import Interfaces, JobSpec

INTEL = ("Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619 (id: c2e19c2f3e)\n"
         "Copyright 2003-2023, Intel Corporation.\n")


def spec(**kw: object) -> JobSpec:
    base: dict[str, object] = dict(
        hosts=(Host("h1", 2), Host("h2", 2)),
        num_proc=4,
        program=("/venv/bin/python", "train.py", "--lr", "1"),
        env=EnvPlan((EnvVar("PATH", "/usr/bin"), EnvVar("API_TOKEN", "s3cr3t", secret=True),
                     EnvVar("PYTHONUNBUFFERED", "1", inline=True))),
        iface=Interfaces(names=("eth0",)),
    )
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


def fake_mpi(bin_dir: Path, text: str, names: tuple[str, ...] = ("mpirun", "mpiexec")) -> None:
    bin_dir.mkdir(parents=True)
    for name in names:
        prog = bin_dir / name
        prog.write_text("#!/bin/sh\ncat <<'EOF'\n" + text + "EOF\n")
        prog.chmod(0o755)
