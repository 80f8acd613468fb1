"""A healthy launcher's facts and env-check's rows, shared by env-check's and the GPU probe's tests."""

from __future__ import annotations

from typing import Any

from dtlaunch.check.facts import HostFacts, PythonFacts
from dtlaunch.mpi import MpiImpl

PY = PythonFacts(found=True, executable="/venv/bin/python", version="3.11.7",
                 torch_version="2.13.0", horovod_version="0.28.1", torch_imported="2.13.0",
                 horovod_imported="0.28.1", frameworks=("PyTorch",), controllers=("MPI", "Gloo"),
                 tensor_ops=("MPI", "Gloo"))
HOST = HostFacts(hostname="me", path="/usr/bin", mpirun="/usr/bin/mpirun", orted="/usr/bin/orted",
                 mpi=MpiImpl("Open MPI", "4.1.4"), python=PY)


def rows(items: Any, section: str) -> list[tuple[str, str, str]]:
    return [(i.check.name, i.check.status, i.check.detail) for i in items if i.section == section]
