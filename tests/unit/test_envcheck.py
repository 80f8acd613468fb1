"""env-check judges Open MPI, torch and Horovod with the doctor's own checks."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers.envcheck import HOST, PY, rows
from helpers.procs import sleeping
from helpers.suite import dtlaunch_argv

from dtlaunch.check.host_checks import check_horovod
from dtlaunch.check.mpi_checks import check_mpi
from dtlaunch.check.report import FAIL, PASS, WARN
from dtlaunch.console.render import env_to_json
from dtlaunch.doctor.envcheck import EnvReport, evaluate_env, gather_env
from dtlaunch.mpi import MpiImpl


@pytest.fixture(scope="module")
def facts() -> dict[str, Any]:
    gathered, _ = gather_env()
    gathered["openmpi"].update({"mpirun": "/usr/bin/mpirun", "version": "4.1.4"})
    gathered["horovod"].update({"version": "0.28.1", "frameworks": ["PyTorch"],
                                "controllers": ["MPI", "Gloo"], "tensor_ops": ["MPI", "Gloo"]})
    gathered["torch"].update({"version": "2.13.0", "cuda": None, "nccl": None})
    return gathered




def test_healthy_machine_lists_the_facts(facts: dict[str, Any]) -> None:
    items = evaluate_env(facts, HOST)
    assert rows(items, "horovod") == [
        ("version", PASS, "0.28.1"), ("frameworks", PASS, "PyTorch"),
        ("controllers", PASS, "MPI, Gloo"), ("tensor operations", PASS, "MPI, Gloo")]
    assert rows(items, "mpi")[:2] == [("mpirun", PASS, "/usr/bin/mpirun"),
                                           ("version", PASS, "4.1.4")]
    report = json.loads(env_to_json(EnvReport(facts, items)))
    assert {"section": "torch", "name": "version", "value": "2.13.0", "status": "pass",
            "hint": ""} in report["items"]


def test_failures_carry_the_doctors_verdict_and_fix(facts: dict[str, Any]) -> None:
    mpich = dataclasses.replace(HOST, mpi=MpiImpl("unknown", ""))
    no_mpi = dataclasses.replace(HOST, python=dataclasses.replace(PY, controllers=("Gloo",)))
    for host, section, expected in ((mpich, "mpi", check_mpi(mpich, None)),
                                    (no_mpi, "horovod", check_horovod(no_mpi.python, None))):
        items = evaluate_env(facts, host)
        failed = [i.check for i in items if i.section == section and i.check.status == FAIL]
        assert len(failed) == 1
        assert (failed[0].detail, failed[0].hint) == (expected.detail, expected.hint)
        assert EnvReport(facts, items).ok is False


def run_env_check(env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(dtlaunch_argv("env-check", "--json"), capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_env_check_with_nothing_on_path_reports_instead_of_crashing() -> None:
    result = run_env_check({**os.environ, "PATH": "/nonexistent"})
    assert "Traceback" not in result.stderr
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    assert doc["openmpi"]["mpirun"] is None and doc["ok"] is False


@pytest.mark.slow
def test_env_check_with_a_hanging_ip_returns(tmp_path: Path) -> None:
    fake = tmp_path / "ip"
    hang = f"3000.{os.getpid()}"  # found by this number: another run's test has its own
    fake.write_text(f"#!/bin/sh\nexec sleep {hang}\n")
    fake.chmod(0o755)
    result = run_env_check({**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})  # bounded
    assert result.returncode in (0, 1), result.stderr
    assert json.loads(result.stdout)["interfaces"] == []
    assert not sleeping(hang)


def test_env_check_ends_a_hung_tool_with_everything_it_started(tmp_path: Path) -> None:
    """A wrapper script whose child hangs (`ssh -V` here; ompi_info goes the same way): the
    child must not outlive env-check (ending only the script would leave it running)."""
    fake = tmp_path / "ssh"
    hang = f"3002.{os.getpid()}"
    fake.write_text(f"#!/bin/sh\nsleep {hang}\necho 'OpenSSH_never'\n")
    fake.chmod(0o755)
    result = run_env_check({**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert result.returncode in (0, 1), result.stderr
    doc = json.loads(result.stdout)
    assert doc["ssh"]["client"] == str(fake) and "timed out" in doc["ssh"]["version"]
    assert not sleeping(hang)


def test_a_one_machine_launcher_in_the_environment_is_a_warning_with_its_fix(
        facts: dict[str, Any]) -> None:
    """An image's OMPI_MCA_plm=isolated: mpirun typed by hand across hosts would run every
    rank here. Other MPI variables stay plain facts."""
    mine = dict(facts, environment={"OMPI_MCA_plm": "isolated",
                                    "OMPI_MCA_btl_vader_single_copy_mechanism": "none"})
    items = {i.check.name: i.check for i in evaluate_env(mine, HOST) if i.section == "environment"}
    assert items["OMPI_MCA_plm"].status == WARN
    assert "unset it" in items["OMPI_MCA_plm"].hint
    assert items["OMPI_MCA_btl_vader_single_copy_mechanism"].status == PASS
    # A warning, not a failure: env-check's verdict is the same as without it.
    assert (EnvReport(mine, evaluate_env(mine, HOST)).ok
            == EnvReport(facts, evaluate_env(facts, HOST)).ok)


def test_a_one_machine_launcher_in_a_parameter_file_is_a_warning_with_its_fix(
        facts: dict[str, Any]) -> None:
    where = "/home/me/.prte/mca-params.conf: plm = isolated"
    mine = dict(facts, openmpi=dict(facts["openmpi"], launcher_set_in=[where]))
    items = [i.check for i in evaluate_env(mine, HOST) if i.section == "environment"
             and i.check.name == "parameter file"]
    assert [(c.status, c.detail) for c in items] == [(WARN, where)]
    assert "remove the line" in items[0].hint
    assert (EnvReport(mine, evaluate_env(mine, HOST)).ok
            == EnvReport(facts, evaluate_env(facts, HOST)).ok)


def test_gather_env_reads_the_parameter_files_launcher_choice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On this machine's own Open MPI, with a real ~/.openmpi/mca-params.conf."""
    if shutil.which("mpirun") is None:
        pytest.skip("needs mpirun")
    (tmp_path / ".openmpi").mkdir()
    (tmp_path / ".openmpi" / "mca-params.conf").write_text("plm = isolated\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    facts, _ = gather_env()
    assert facts["openmpi"]["launcher_set_in"] == [
        f"{tmp_path}/.openmpi/mca-params.conf: plm = isolated"]


@pytest.mark.parametrize("kind", ["fifo", "dir"])
def test_a_parameter_file_that_is_not_a_regular_file_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, facts: dict[str, Any], kind: str) -> None:
    """mpirun would hang on a FIFO there, or stop with status 2 on a directory, without a
    word about it: env-check names the file (as run refuses it, in one line)."""
    conf = tmp_path / ".openmpi" / "mca-params.conf"
    conf.parent.mkdir()
    if kind == "fifo":
        os.mkfifo(conf)
    else:
        conf.mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    from dtlaunch.openmpi.mca import unusable_param_files

    found = unusable_param_files("")
    assert len(found) == 1 and str(conf) in found[0], found
    assert ("FIFO" if kind == "fifo" else "directory") in found[0]
    mine = dict(facts, openmpi=dict(facts["openmpi"], unusable_files=found))
    items = [i.check for i in evaluate_env(mine, HOST) if i.section == "environment"
             and i.check.name == "parameter file"]
    assert [(c.status, c.detail) for c in items] == [(WARN, found[0])]
    assert "regular file" in items[0].hint
