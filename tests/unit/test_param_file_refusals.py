"""An ssh agent that accepts any host key is refused from every place the MPI launcher reads
one: Open MPI's and PRRTE's parameter files (the user's, the installation's, those named by
-am, --tune or mca_base_param_files) and Hydra's configuration file; with or without
--no-check. A parameter file that is not a regular one (a FIFO mpirun would wait on for ever,
a directory, a file over 1 MiB) is named in one line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers.mpis import fake_mpi
from helpers.suite import REPO, dtlaunch_argv

OMPI = "mpirun (Open MPI) 4.1.4\n"
HYDRA = "HYDRA build details:\n    Version:                                 4.0.2\n"
INSECURE = "ssh -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"


def dry_run(tmp_path: Path, *args: str, banner: str = OMPI, check: bool = False,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "mpi" / "bin"
    if not bin_dir.exists():
        fake_mpi(bin_dir, banner)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    full = {**os.environ, "HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "PYTHONPATH": str(REPO),
            **(env or {})}
    argv = dtlaunch_argv("run", *([] if check else ["--no-check"]), "--dry-run", "-H", "a,b",
                         *args, "true")
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env=full)


def refused(done: subprocess.CompletedProcess[str], where: str) -> None:
    assert done.returncode != 0, done.stdout
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr
    assert where in lines[-1] and "StrictHostKeyChecking=no" in lines[-1], done.stderr
    assert "refuses that" in lines[-1]
    assert "mpirun" not in done.stdout


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize(("folder", "name"), [(".openmpi", "orte_rsh_agent"),
                                              (".openmpi", "plm_rsh_args"),
                                              (".prte", "plm_ssh_agent"),
                                              (".prte", "prte_ssh_agent")])
def test_the_users_parameter_file(tmp_path: Path, folder: str, name: str) -> None:
    conf = write(tmp_path / "home" / folder / "mca-params.conf", f"{name} = {INSECURE}\n")
    refused(dry_run(tmp_path), str(conf))


def test_the_installations_parameter_file_with_or_without_no_check(tmp_path: Path) -> None:
    conf = write(tmp_path / "mpi" / "etc" / "openmpi-mca-params.conf",
                 f"orte_rsh_agent = {INSECURE}\n")
    fake_mpi(tmp_path / "mpi" / "bin", OMPI)
    refused(dry_run(tmp_path), str(conf))
    refused(dry_run(tmp_path, check=True), str(conf))


@pytest.mark.parametrize("flag", ["-am", "--am"])
def test_an_aggregate_parameter_file(tmp_path: Path, flag: str) -> None:
    write(tmp_path / "ok.conf", "btl = self,tcp\n")
    conf = write(tmp_path / "agent.conf", f"plm_rsh_agent = {INSECURE}\n")
    refused(dry_run(tmp_path, "--mpi-args", f"{flag} ok.conf,{conf}"), str(conf))


@pytest.mark.parametrize("flag", ["--tune", "-tune"])
def test_a_tune_file(tmp_path: Path, flag: str) -> None:
    conf = write(tmp_path / "tune.conf", f"-mca plm_rsh_agent \"{INSECURE}\"\n")
    refused(dry_run(tmp_path, "--mpi-args", f"{flag} {conf}"), str(conf))


def test_mca_base_param_files_from_the_environment_or_the_command_line(tmp_path: Path) -> None:
    conf = write(tmp_path / "p.conf", "plm_rsh_args = -o StrictHostKeyChecking=no\n")
    refused(dry_run(tmp_path, env={"OMPI_MCA_mca_base_param_files": f"/nonexistent:{conf}"}),
            str(conf))
    refused(dry_run(tmp_path, "--mpi-args", f"--mca mca_base_param_files {conf}"), str(conf))


def test_a_safe_parameter_file_is_not_refused(tmp_path: Path) -> None:
    write(tmp_path / "home" / ".openmpi" / "mca-params.conf",
          "# plm_rsh_agent = ssh -o StrictHostKeyChecking=no\nbtl = self,tcp\n"
          "plm_rsh_args = -o StrictHostKeyChecking=yes\n")
    done = dry_run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "mpirun" in done.stdout


@pytest.mark.parametrize("where", ["env", "prefix"])
def test_hydras_configuration_file(tmp_path: Path, where: str) -> None:
    text = f"-launcher ssh -launcher-exec \"{INSECURE}\"\n"
    if where == "env":
        conf = write(tmp_path / "hydra.conf", text)
        done = dry_run(tmp_path, banner=HYDRA, env={"HYDRA_CONFIG_FILE": str(conf)})
    else:
        conf = write(tmp_path / "mpi" / "etc" / "mpiexec.hydra.conf", text)
        fake_mpi(tmp_path / "mpi" / "bin", HYDRA)
        done = dry_run(tmp_path, banner=HYDRA)
    refused(done, str(conf))


@pytest.mark.parametrize("kind", ["fifo", "dir", "big"])
def test_a_parameter_file_that_is_not_a_small_regular_file_is_named(
        tmp_path: Path, kind: str) -> None:
    conf = tmp_path / "home" / ".openmpi" / "mca-params.conf"
    conf.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(conf)  # before: a silent hang (a dry run passed; mpirun waited for ever)
    elif kind == "dir":
        conf.mkdir()
    else:
        conf.write_text("# padding\n" * 200_000)
    done = dry_run(tmp_path)
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert str(conf) in last and ("FIFO" in last or "directory" in last or "MiB" in last), last
