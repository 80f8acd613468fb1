"""The one builder of a healthy host's facts, as the probe would report them; a test changes
only what it is about."""

from __future__ import annotations

import dataclasses
from typing import Any

from dtlaunch.check.facts import HostFacts, Iface, PythonFacts
from dtlaunch.mpi import MpiImpl

OPEN_MPI_4 = MpiImpl("Open MPI", "4.1.4")
IFACES = (Iface("lo", True, ("127.0.0.1/8",)), Iface("eth0", True, ("10.1.2.11/24",)),
          Iface("eth1", False, ()))


def python_facts(**changes: Any) -> PythonFacts:
    """A venv with torch 2.13.0 and Horovod 0.28.1 built for PyTorch with MPI and Gloo."""
    healthy = PythonFacts(
        found=True, executable="/venv/bin/python", version="3.11.7", torch_version="2.13.0",
        horovod_version="0.28.1", torch_imported="2.13.0", horovod_imported="0.28.1",
        frameworks=("PyTorch",), controllers=("MPI", "Gloo"), tensor_ops=("MPI", "Gloo"),
        module_found=True)
    return dataclasses.replace(healthy, **changes)


def host_facts(hostname: str = "h1", **changes: Any) -> HostFacts:
    """A host with Open MPI 4.1.4 on /usr/bin, python_facts(), the job's script and a network."""
    healthy = HostFacts(hostname=hostname, path="/usr/bin", mpirun="/usr/bin/mpirun",
                        orted="/usr/bin/orted", mpi=OPEN_MPI_4, ifaces=IFACES,
                        python=python_facts(), script_exists=True)
    return dataclasses.replace(healthy, **changes)
