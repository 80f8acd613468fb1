"""dtlaunch run and doctor with MPICH and Intel MPI (Hydra's mpiexec) on the multi-host test bed.

MPICH comes from PyPI's `mpich` wheel, Intel MPI from PyPI's `impi-devel`, each in its own venv
(scripts/setup_mpis.sh), at the same path on every bed host; dtlaunch picks Hydra because that
venv's mpirun comes first on PATH. Hydra's proxies connect back to the launcher's hostname, so
dtlaunch runs inside host h1. The tests that take `hydra_mpi` run once per MPI; the others
(MPICH's) cover what both share in dtlaunch's own code.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.jobs import assert_no_strays as _assert_no_strays
from helpers.jobs import records, start_job
from helpers.mpi_envs import MPI_VENVS, make_mpi_env
from helpers.suite import SCRIPTS, dtlaunch_argv, unavailable
from helpers.testbed import TestBed

pytestmark = pytest.mark.testbed
PROBE = str(SCRIPTS / "rank_probe.py")


def assert_no_strays(bed: TestBed, pids: tuple[int, ...] = ()) -> None:
    """Nothing left on any host. Hydra's proxies end when mpiexec's control connection goes,
    which on a loaded machine takes longer than Open MPI's daemons: wait up to 30 s."""
    _assert_no_strays(bed, within=30.0, pids=pids)


@pytest.fixture
def bed(make_bed) -> TestBed:  # type: ignore[no-untyped-def]
    """A bed of 3 hosts for each test here (built in 0.3 s), not the session's shared one: a
    Hydra proxy that outlives its test is then that test's alone, never a stray in another
    file's test (seen once in a full run: two processes on h1 and h2 after the doctor and
    timeout tests, every later test on the shared bed failing on them)."""
    return make_bed(3)  # type: ignore[no-any-return]


# The Hydra MPIs the bed runs: their venv's name and what doctor calls them.
HYDRA_MPIS = {"mpich": "MPICH 5.0.2", "intelmpi": "Intel MPI 2021.18.1"}


def hydra_bin(name: str) -> Path:
    """The MPI alone is enough here: the ranks are plain Python programs (Horovod: its own test)."""
    found = MPI_VENVS / name / "bin"
    if not (found / "mpiexec").exists():
        unavailable(f"no {name} venv at {found.parent} (run scripts/setup_mpis.sh {name})")
    return found


def mpich_bin() -> Path:
    return hydra_bin("mpich")


def mpich_python() -> str:
    """The MPICH venv's interpreter: its Horovod is built for MPICH, which the pre-flight
    requires of a job that mpiexec starts."""
    return str(mpich_bin() / "python")


def first_on_path(folder: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{folder}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


@pytest.fixture
def mpich_env() -> dict[str, str]:
    """dtlaunch's environment with MPICH first on PATH."""
    return first_on_path(mpich_bin())


@dataclass(frozen=True)
class HydraMpi:
    id: str  # the venv's name: "mpich", "intelmpi"
    named: str  # "MPICH 5.0.2", as doctor reports it
    bin: Path

    def environ(self) -> dict[str, str]:
        return first_on_path(self.bin)


@pytest.fixture(params=list(HYDRA_MPIS))
def hydra_mpi(request: pytest.FixtureRequest) -> HydraMpi:
    """Each Hydra MPI in turn: MPICH, then Intel MPI."""
    return HydraMpi(request.param, HYDRA_MPIS[request.param], hydra_bin(request.param))


def run_argv(bed: TestBed, hosts: str, *args: str, extra: tuple[str, ...] = (),
             command: str = "run") -> list[str]:
    flags = ("--no-check",) if command == "run" else ()
    return bed.nsenter_argv("h1", dtlaunch_argv(
        command, *flags, "-H", hosts, "--iface", "eth0", "--ssh-config", str(bed.ssh_config),
        *extra, *args))


def run(bed: TestBed, env: dict[str, str], hosts: str, *args: str, extra: tuple[str, ...] = (),
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(run_argv(bed, hosts, *args, extra=extra), capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_dry_run_is_an_mpiexec_line(bed: TestBed, hydra_mpi: HydraMpi) -> None:
    env = {**hydra_mpi.environ(), "API_TOKEN": "s3cr3t"}
    result = run(bed, env, "h1:1,h2:2", PROBE, extra=("--dry-run", "-x", "API_TOKEN"))
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    if hydra_mpi.id == "intelmpi":  # its Hydra ignores `-hosts h1:1,h2:2`: a set per host
        assert line.startswith("mpiexec -launcher ssh -launcher-exec ")
        assert line.endswith(f" -n 1 -host h1 {sys.executable} {PROBE} : -n 2 -host h2 "
                             f"{sys.executable} {PROBE}")
    else:
        assert line.startswith("mpiexec -n 3 -hosts h1:1,h2:2 -launcher ssh -launcher-exec ")
    assert " -iface eth0 -prepend-rank -genvlist " in line
    assert " -genv FI_TCP_IFACE eth0 " in line
    assert "API_TOKEN" in line and "s3cr3t" not in line


def test_two_hosts_tagged_output_and_only_named_variables(
        bed: TestBed, hydra_mpi: HydraMpi, tmp_path: Path) -> None:
    env = {**hydra_mpi.environ(), "HOROVOD_FUSION_THRESHOLD": "1234", "UNLISTED_VAR": "x"}
    result = run(bed, env, "h1:1,h2:2", PROBE, "--out", str(tmp_path),
                 extra=("--output-dir", str(tmp_path / "logs")))
    assert result.returncode == 0, result.stderr
    found = records(tmp_path)
    assert [found[r]["host"] for r in range(3)] == ["h1", "h2", "h2"]
    for rank in range(3):
        assert f"[{rank}@{found[rank]['host']}] rank {rank} of 3 on {found[rank]['host']}" \
            in result.stdout.splitlines()
        assert (tmp_path / "logs" / f"rank.{rank}.log").read_text() == \
            f"rank {rank} of 3 on {found[rank]['host']}\n"
    remote = found[2]["env"]
    assert remote["HOROVOD_FUSION_THRESHOLD"] == "1234" and remote["PYTHONUNBUFFERED"] == "1"
    assert "UNLISTED_VAR" not in remote
    assert_no_strays(bed)


def test_killed_rank_names_rank_and_host(bed: TestBed, hydra_mpi: HydraMpi,
                                         tmp_path: Path) -> None:
    result = run(bed, hydra_mpi.environ(), "h1:1,h2:1", PROBE, "--out", str(tmp_path), "--kill-rank", "1",
                 "--sleep", "30")
    assert result.returncode != 0
    last = result.stderr.splitlines()[-1]
    assert last.startswith("dtlaunch: job failed: rank 1 on host h2 "), result.stderr
    assert "signal 9" in last
    assert_no_strays(bed)


def test_rank_exit_code_names_rank_and_host(bed: TestBed, hydra_mpi: HydraMpi,
                                            tmp_path: Path) -> None:
    result = run(bed, hydra_mpi.environ(), "h1:1,h2:1", PROBE, "--out", str(tmp_path), "--exit-rank", "1",
                 "--exit-code", "3")
    assert result.returncode == 3
    assert result.stderr.splitlines()[-1] == "dtlaunch: job failed: rank 1 on host h2 exited with code 3"
    assert_no_strays(bed)


def start_sleeping_job(bed: TestBed, env: dict[str, str], hosts: str, out: Path,
                       extra: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    argv = run_argv(bed, hosts, PROBE, "--out", str(out), "--sleep", "600", extra=extra)
    return start_job(argv, out, len(hosts.split(",")), env=env)


@pytest.mark.parametrize(("sig", "expected"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_every_rank_on_every_host(bed: TestBed, hydra_mpi: HydraMpi,
                                               tmp_path: Path, sig: signal.Signals,
                                               expected: int) -> None:
    proc = start_sleeping_job(bed, hydra_mpi.environ(), "h1:1,h2:1,h3:1", tmp_path)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == expected, err
    assert f"stopped by {sig.name}" in err and "job failed" not in err
    assert_no_strays(bed, pids=tuple(r["pid"] for r in records(tmp_path).values()))


def test_timeout_stops_the_job(bed: TestBed, hydra_mpi: HydraMpi, tmp_path: Path) -> None:
    result = run(bed, hydra_mpi.environ(), "h1:1,h2:1", PROBE, "--out", str(tmp_path), "--sleep", "120",
                 extra=("--timeout", "5"))
    assert result.returncode == 124, result.stderr
    assert "--timeout 5 s" in result.stderr
    assert_no_strays(bed)


def test_lost_host_is_noticed(make_bed, hydra_mpi: HydraMpi, tmp_path: Path) -> None:
    testbed = make_bed(2)
    proc = start_sleeping_job(testbed, hydra_mpi.environ(), "h1:1,h2:1", tmp_path)
    testbed.set_link("h2", up=False)  # h2 stops answering, as a powered-off machine would
    _, err = proc.communicate(timeout=90)
    assert proc.returncode != 0
    assert err.splitlines()[-1] == "dtlaunch: job failed: lost the SSH connection to host h2"
    assert not testbed.stray_pids("h1")


def _mixed_mpi(folder: Path, h2_has: str) -> dict[str, str]:
    """A bin directory, on the shared filesystem, whose `mpirun` and `mpiexec` are one MPI's on
    every host but h2, where they are another's: one host with another MPI installed at the
    launcher's path. h2_has "openmpi": the system's Open MPI on h2, MPICH elsewhere; "mpich":
    MPICH on h2 and the system's Open MPI elsewhere, or Intel MPI when h2_has is
    "mpich-in-intelmpi". Returns dtlaunch's environment with it first on PATH."""
    mpich, ompi = mpich_bin(), Path("/usr/bin")
    if not (ompi / "mpirun").exists():
        unavailable("the system's Open MPI (/usr/bin/mpirun) is not installed")
    launcher_mpi = hydra_bin("intelmpi") if h2_has == "mpich-in-intelmpi" else ompi
    on_h2, elsewhere = (ompi, mpich) if h2_has == "openmpi" else (mpich, launcher_mpi)
    folder.mkdir()
    for name in ("mpirun", "mpiexec"):
        if not (elsewhere / name).exists():
            continue  # Debian's Open MPI has its mpiexec too; each venv has both
        (folder / name).write_text(
            f'#!/bin/sh\nif [ "$(uname -n)" = h2 ]; then exec {on_h2}/{name} "$@"; fi\n'
            f'exec {elsewhere}/{name} "$@"\n')
        (folder / name).chmod(0o755)
    for name, source in (("orted", ompi), ("hydra_pmi_proxy", mpich)):
        (folder / name).symlink_to(source / name)
    # Intel MPI's mpirun is a script that runs the mpiexec.hydra it finds on PATH.
    path = [str(folder), *([str(launcher_mpi)] if launcher_mpi != ompi else [])]
    return {**os.environ, "PATH": ":".join([*path, os.environ.get("PATH", "/usr/bin:/bin")])}


@pytest.mark.parametrize("h2_has", ["openmpi", "mpich", "mpich-in-intelmpi"])
def test_doctor_names_a_host_with_the_other_mpi(bed: TestBed, tmp_path: Path, h2_has: str) -> None:
    env = _mixed_mpi(tmp_path / "bin", h2_has)
    result = subprocess.run(run_argv(bed, "h2", "--json", command="doctor"), capture_output=True,
                            text=True, timeout=120, env=env)
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    hosts = {h["host"]: h for h in doc["hosts"]}
    mpi = {c["name"]: c for c in hosts["h2"]["checks"]}["mpi"]
    assert mpi["status"] == "fail"
    launcher = next(h for h in doc["hosts"] if h["role"] == "launcher")
    if h2_has == "openmpi":  # an Open MPI host in an MPICH job
        assert "is Open MPI 4" in mpi["detail"]
        assert mpi["detail"].endswith("this machine's mpiexec is MPICH 5.0.2")
        assert mpi["hint"].startswith("install MPICH 5.0.2 on this host at this machine's mpiexec path")
        assert launcher["versions"]["mpi"] == "MPICH 5.0.2"
    elif h2_has == "mpich":  # an MPICH host in an Open MPI job
        assert "is MPICH 5.0.2; this machine's mpirun is Open MPI 4" in mpi["detail"]
        assert mpi["hint"].startswith("put Open MPI 4")
        assert launcher["versions"]["mpi"].startswith("Open MPI 4")
    else:  # an MPICH host in an Intel MPI job: both Hydra, not the same MPI
        intel = HYDRA_MPIS["intelmpi"]
        assert mpi["detail"] == f"MPICH 5.0.2 here, {intel} on this machine"
        assert mpi["hint"].startswith(f"install {intel} on this host at this machine's mpiexec path")
        assert launcher["versions"]["mpi"] == intel
    # Each host's MPI is named in its versions.
    assert hosts["h2"]["versions"]["mpi"].startswith("Open MPI 4" if h2_has == "openmpi"
                                                     else "MPICH 5.0.2")


def test_preflight_passes_with_the_same_mpi_everywhere(make_bed, hydra_mpi: HydraMpi,
                                                       tmp_path: Path) -> None:
    """The launcher's MPI is at the same path on every host (a shared filesystem): the
    pre-flight passes, and doctor names it and its version for every host."""
    testbed = make_bed(2)
    env = hydra_mpi.environ()
    argv = testbed.nsenter_argv("h1", dtlaunch_argv(
        "run", "-H", "h1:1,h2:1", "--iface", "eth0", "--ssh-config", str(testbed.ssh_config),
        "--disable-cache", "--python", str(hydra_mpi.bin / "python"), PROBE, "--out",
        str(tmp_path)))
    result = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stderr
    assert sorted(r["host"] for r in records(tmp_path).values()) == ["h1", "h2"]
    doctor = subprocess.run(testbed.nsenter_argv("h1", dtlaunch_argv(
        "doctor", "-H", "h1,h2", "--iface", "eth0", "--ssh-config", str(testbed.ssh_config),
        "--python", str(hydra_mpi.bin / "python"), "--json")), capture_output=True, text=True,
        timeout=180, env=env)
    doc = json.loads(doctor.stdout)
    assert {h["host"]: h["versions"]["mpi"] for h in doc["hosts"]} == {
        h: hydra_mpi.named for h in ("h1", "h2", next(h["host"] for h in doc["hosts"]
                                                       if h["role"] == "launcher"))}
    # Every host is asked about the mpiexec the job starts (its path, not the PATH's).
    for host in doc["hosts"]:
        checks = {c["name"]: c for c in host["checks"]}
        assert checks["mpirun"]["detail"] == str(hydra_mpi.bin / "mpiexec"), checks["mpirun"]
    assert doctor.returncode == 0, doctor.stdout


def test_failed_rank_ends_the_job_while_others_still_run(bed: TestBed, hydra_mpi: HydraMpi,
                                                          tmp_path: Path) -> None:
    """Hydra itself waits for the other ranks (which may wait forever for the failed one):
    the failed rank's exit record ends the job."""
    result = run(bed, hydra_mpi.environ(), "h1:1,h2:1,h3:1", PROBE, "--out", str(tmp_path),
                 "--exit-rank", "2", "--exit-code", "5", "--sleep", "600", timeout=90)
    assert result.returncode == 5, result.stderr
    assert result.stderr.splitlines()[-1] == "dtlaunch: job failed: rank 2 on host h3 exited with code 5"
    assert_no_strays(bed, pids=tuple(r["pid"] for r in records(tmp_path).values()))


def test_heavy_output_of_several_ranks_per_host_arrives_whole(
        bed: TestBed, hydra_mpi: HydraMpi) -> None:
    result = run(bed, hydra_mpi.environ(), "h1:2,h2:2", str(SCRIPTS / "chatty_rank.py"), "3000")
    assert result.returncode == 0, result.stderr[-2000:]
    hosts = ["h1", "h1", "h2", "h2"]
    for rank in range(4):
        want_out = [f"[{rank}@{hosts[rank]}] rank {rank} line {i} " + "x" * (i % 300)
                    for i in range(3000) if i % 10]
        want_err = [f"[{rank}@{hosts[rank]}] rank {rank} line {i} " + "x" * (i % 300)
                    for i in range(3000) if i % 10 == 0]
        prefix = f"[{rank}@"
        assert [line for line in result.stdout.splitlines() if line.startswith(prefix)] == want_out
        assert [line for line in result.stderr.splitlines() if line.startswith(prefix)] == want_err


def test_horovod_allreduce_on_two_hosts(bed: TestBed, hydra_mpi: HydraMpi,
                                        tmp_path: Path) -> None:
    """Horovod built against the MPI of its own venv (PyPI's mpich, impi-devel), through
    dtlaunch run: the allreduce's sum on every rank, each rank's output tagged."""
    mpi = make_mpi_env(hydra_mpi.id)
    argv = bed.nsenter_argv("h1", mpi.dtlaunch_argv(
        "run", "-H", "h1:1,h2:1", "--iface", "eth0", "--ssh-config", str(bed.ssh_config),
        PROBE, "--out", str(tmp_path), "--horovod"))
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                            env=mpi.environ())
    assert result.returncode == 0, result.stderr
    found = records(tmp_path)
    assert [found[r]["host"] for r in (0, 1)] == ["h1", "h2"]
    assert all(r["allreduce_sum"] == 3.0 for r in found.values())  # 1 + 2
    assert all(r["python"] == mpi.python for r in found.values())
    assert "[0@h1] rank 0 of 2 on h1" in result.stdout
    assert "[1@h2] rank 1 of 2 on h2" in result.stdout
    assert_no_strays(bed)


@pytest.fixture(scope="module")
def mpi_program(tmp_path_factory: pytest.TempPathFactory) -> str:
    """tests/scripts/mpi_allreduce.c built with MPICH's mpicc (a real MPI rank, no Python)."""
    mpicc = mpich_bin() / "mpicc"
    if shutil.which("cc") is None or not mpicc.exists():
        unavailable("a C compiler and MPICH's mpicc are needed to build the MPI test program")
    target = tmp_path_factory.mktemp("mpi") / "mpi_allreduce"
    subprocess.run([str(mpicc), "-o", str(target), str(SCRIPTS / "mpi_allreduce.c")],
                   check=True, capture_output=True, timeout=120)
    return str(target)


def test_mpi_allreduce_of_a_real_mpi_program(bed: TestBed, mpich_env: dict[str, str],
                                             mpi_program: str) -> None:
    result = run(bed, mpich_env, "h1:1,h2:2", mpi_program)
    assert result.returncode == 0, result.stderr
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("["))
    assert lines == ["[0@h1] rank 0 of 3 on h1 sum 6", "[1@h2] rank 1 of 3 on h2 sum 6",
                     "[2@h2] rank 2 of 3 on h2 sum 6"]
    assert_no_strays(bed)


def test_mpi_rank_exiting_before_a_barrier_ends_the_job(bed: TestBed, mpich_env: dict[str, str],
                                                         mpi_program: str) -> None:
    """Hydra alone would leave rank 0 waiting in the barrier for ever."""
    result = run(bed, mpich_env, "h1:1,h2:1", mpi_program, "1", timeout=90)
    assert result.returncode == 3, result.stderr
    assert result.stderr.splitlines()[-1] == "dtlaunch: job failed: rank 1 on host h2 exited with code 3"
    assert_no_strays(bed)


def test_network_chosen_by_the_preflight_becomes_hydras_iface(make_bed, hydra_mpi: HydraMpi,
                                                              tmp_path: Path) -> None:
    """No --iface, a docker0 bridge with the same address on every host: the pre-flight's
    choice (eth0, docker0 left out) is Hydra's -iface and libfabric's FI_TCP_IFACE. A Horovod
    allreduce proves the ranks' data path: Intel MPI's without FI_TCP_IFACE took docker0 and
    waited for ever (measured with its own mpiexec and IMB-MPI1)."""
    testbed = make_bed(2, docker0=True)
    mpi = make_mpi_env(hydra_mpi.id)
    argv = testbed.nsenter_argv("h1", mpi.dtlaunch_argv(
        "run", "-v", "-H", "h1:1,h2:1", "--ssh-config", str(testbed.ssh_config),
        "--disable-cache", PROBE, "--out", str(tmp_path), "--horovod"))
    result = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=mpi.environ())
    assert result.returncode == 0, result.stderr
    assert "dtlaunch: network: " in result.stderr
    assert " -iface eth0 " in result.stderr  # the line run shows with -v
    assert " -genv FI_TCP_IFACE eth0 " in result.stderr
    found = records(tmp_path)
    assert sorted(r["host"] for r in found.values()) == ["h1", "h2"]
    assert all(r["allreduce_sum"] == 3.0 for r in found.values())


def test_a_host_key_changed_since_a_cached_preflight_is_named_not_hung(
        make_bed, mpich_env: dict[str, str], tmp_path: Path) -> None:
    """A cache hit leaves the keys to ssh: Hydra's launch of h2 is refused, the job fails at
    its start, and only then are the keys checked and the full report printed."""
    bed = make_bed(2)
    env = {**mpich_env, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    argv = bed.nsenter_argv("h1", dtlaunch_argv(
        "run", "-H", "h1:1,h2:1", "--iface", "eth0", "--ssh-config", str(bed.ssh_config),
        "--python", mpich_python(), PROBE, "--out", str(tmp_path)))
    first = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env)
    assert first.returncode == 0, first.stderr
    bed.restart_with_new_host_key("h2")
    second = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert second.returncode == 1, second.stderr
    assert "pre-flight checks failed: h2 (ssh); the job did not start" in second.stderr
    assert "MAN-IN-THE-MIDDLE" in second.stderr
    assert_no_strays(bed)


@pytest.mark.parametrize("runs", ["mpich", "openmpi"])
def test_doctor_names_a_horovod_built_for_the_other_mpi(bed: TestBed, mpich_env: dict[str, str],
                                                       runs: str) -> None:
    """Horovod links one MPI: the main venv's is built for Open MPI 4, the MPICH venv's for
    MPICH. Each started by the other MPI's launcher is named, with the rebuild."""
    python = sys.executable if runs == "mpich" else mpich_python()
    env = mpich_env if runs == "mpich" else dict(os.environ)
    result = subprocess.run(bed.nsenter_argv("h1", dtlaunch_argv(
        "doctor", "-H", "h2", "--iface", "eth0", "--ssh-config", str(bed.ssh_config),
        "--python", python, "--json")), capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    for host in doc["hosts"]:  # h2 and the launcher alike
        horovod = {c["name"]: c for c in host["checks"]}["horovod"]
        assert horovod["status"] == "fail", horovod
        if runs == "mpich":
            assert horovod["detail"].startswith("horovod loads Open MPI 4 (")
            assert f"but the job runs MPICH 5.0.2 ({mpich_bin()}/" in horovod["detail"]
        else:
            assert "horovod loads MPICH or Intel MPI (" in horovod["detail"]
            assert "but the job runs Open MPI 4" in horovod["detail"]
        assert horovod["hint"].startswith("build Horovod against the job's MPI")
