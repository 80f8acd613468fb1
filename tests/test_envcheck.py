"""env-check judges Open MPI, torch and Horovod with the doctor's own checks."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dtlaunch.checks import check_horovod, check_open_mpi
from dtlaunch.envcheck import env_report, evaluate_env, gather_env
from dtlaunch.facts import HostFacts, PythonFacts
from dtlaunch.mpi import MpiImpl
from dtlaunch.report import FAIL, PASS

PY = PythonFacts(found=True, executable="/venv/bin/python", version="3.11.7",
                 torch_version="2.13.0", horovod_version="0.28.1", torch_imported="2.13.0",
                 horovod_imported="0.28.1", frameworks=("PyTorch",), controllers=("MPI", "Gloo"),
                 tensor_ops=("MPI", "Gloo"))
HOST = HostFacts(hostname="me", path="/usr/bin", mpirun="/usr/bin/mpirun", orted="/usr/bin/orted",
                 mpi=MpiImpl("Open MPI", "4.1.4"), python=PY)


@pytest.fixture(scope="module")
def facts() -> dict[str, Any]:
    gathered, _ = gather_env()
    gathered["openmpi"].update({"mpirun": "/usr/bin/mpirun", "version": "4.1.4"})
    gathered["horovod"].update({"version": "0.28.1", "frameworks": ["PyTorch"],
                                "controllers": ["MPI", "Gloo"], "tensor_ops": ["MPI", "Gloo"]})
    gathered["torch"].update({"version": "2.13.0", "cuda": None, "nccl": None})
    return gathered


def rows(items: Any, section: str) -> list[tuple[str, str, str]]:
    return [(i.check.name, i.check.status, i.check.detail) for i in items if i.section == section]


def test_healthy_machine_lists_the_facts(facts: dict[str, Any]) -> None:
    items = evaluate_env(facts, HOST)
    assert rows(items, "horovod") == [
        ("version", PASS, "0.28.1"), ("frameworks", PASS, "PyTorch"),
        ("controllers", PASS, "MPI, Gloo"), ("tensor operations", PASS, "MPI, Gloo")]
    assert rows(items, "open-mpi")[:2] == [("mpirun", PASS, "/usr/bin/mpirun"),
                                           ("version", PASS, "4.1.4")]
    report = env_report(facts, items)
    assert {"section": "torch", "name": "version", "value": "2.13.0", "status": "pass",
            "hint": ""} in report["items"]


def test_failures_carry_the_doctors_verdict_and_fix(facts: dict[str, Any]) -> None:
    mpich = dataclasses.replace(HOST, mpi=MpiImpl("MPICH", "4.0"))
    no_mpi = dataclasses.replace(HOST, python=dataclasses.replace(PY, controllers=("Gloo",)))
    for host, section, expected in ((mpich, "open-mpi", check_open_mpi(mpich, None)),
                                    (no_mpi, "horovod", check_horovod(no_mpi.python, None))):
        items = evaluate_env(facts, host)
        failed = [i.check for i in items if i.section == section and i.check.status == FAIL]
        assert len(failed) == 1
        assert (failed[0].detail, failed[0].hint) == (expected.detail, expected.hint)
        assert env_report(facts, items)["ok"] is False
