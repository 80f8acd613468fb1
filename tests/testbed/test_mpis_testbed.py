"""The multi-host suite once per MPI: Open MPI 4 (the system's), Open MPI 5, MPICH and Intel
MPI (PyPI's wheels in their own venvs, Horovod built against each). Real sshd, real launchers,
real ranks.

`run_mpi_env` covers the Open MPIs (conftest.DTLAUNCH_RUN_MPIS); MPICH and Intel MPI have the
same suite through Hydra in tests/testbed/test_hydra_testbed.py. `mpi_env` covers every MPI, for what
holds for all of them (Horovod's build for that MPI).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
from pathlib import Path

import pytest
from helpers.jobs import assert_no_strays, records, start_job
from helpers.mpi_envs import MPI_VENVS, MpiEnv
from helpers.procs import HANG, survivors
from helpers.suite import SCRIPTS
from helpers.testbed import TestBed

pytestmark = pytest.mark.testbed
PROBE = str(SCRIPTS / "rank_probe.py")
# What each MPI's own `--version` says, as doctor reports it.
VERSIONS = {"openmpi5": "Open MPI 5.0.11", "mpich": "MPICH 5.0.2"}


def dtl(mpi: MpiEnv, bed: TestBed, *args: str, check: bool = False, timeout: float = 180,
        extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = mpi.dtlaunch_argv(args[0], *(() if check else ("--no-check",)), "--ssh-config",
                             str(bed.ssh_config), *args[1:])
    return subprocess.run(argv, capture_output=True, text=True,
                          env={**mpi.environ(), **(extra_env or {})}, timeout=timeout)


def start_sleeping_job(mpi: MpiEnv, testbed: TestBed, out: Path) -> subprocess.Popen[str]:
    """A job of one sleeping rank on h1 and one on h2, returned once both run."""
    argv = mpi.dtlaunch_argv("run", "--no-check", "--ssh-config", str(testbed.ssh_config),
                             "-H", "h1:1,h2:1", "--iface", testbed.subnet, PROBE,
                             "--out", str(out), "--sleep", "600")
    return start_job(argv, out, 2, env=mpi.environ())


def test_horovod_allreduce_through_dtlaunch_run(bed: TestBed, run_mpi_env: MpiEnv,
                                                tmp_path: Path) -> None:
    result = dtl(run_mpi_env, bed, "run", "-H", "h1:1,h2:1", "--iface", bed.subnet, PROBE,
                 "--out", str(tmp_path), "--horovod")
    assert result.returncode == 0, result.stderr
    found = records(tmp_path)
    assert sorted(found) == [0, 1]
    assert [found[r]["host"] for r in (0, 1)] == ["h1", "h2"]
    assert all(r["allreduce_sum"] == 3.0 for r in found.values())  # 1 + 2
    # The ranks ran the MPI's own interpreter (its venv), so Horovod was the one built for it.
    assert all(r["python"] == run_mpi_env.python for r in found.values())
    assert "[1@h2] rank 1 of 2 on h2" in result.stdout
    assert_no_strays(bed)


def test_failing_rank_is_named(bed: TestBed, run_mpi_env: MpiEnv, tmp_path: Path) -> None:
    result = dtl(run_mpi_env, bed, "run", "-H", "h1:1,h2:1", "--iface", bed.subnet, PROBE,
                 "--out", str(tmp_path), "--exit-rank", "1", "--exit-code", "3", "--sleep", "30")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last == "dtlaunch: job failed: rank 1 on host h2 exited with code 3", result.stderr
    assert_no_strays(bed)


@pytest.mark.parametrize("option, words", [
    ("--binding-args", "-bind-to core -map-by core -report-bindings"),
    # dtlaunch's own --bind-to none was on the line too: Open MPI 5 refuses an option twice.
    ("--mpi-args", "-bind-to core -report-bindings"),
])
def test_horovodrun_binding_args_bind_the_ranks_under_every_open_mpi(
        bed: TestBed, run_mpi_env: MpiEnv, tmp_path: Path, option: str, words: str) -> None:
    """horovodrun users write `-bind-to core`; Open MPI 5's launcher refused that form."""
    result = dtl(run_mpi_env, bed, "run", "-H", "h1:1,h2:1", "--iface", bed.subnet,
                 option, words, PROBE, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    found = records(tmp_path)
    assert [found[r]["host"] for r in (0, 1)] == ["h1", "h2"]
    # Open MPI's own report that each rank was bound (its wording differs between 4 and 5).
    output = result.stdout + result.stderr
    assert "rank 0 bound to" in output.lower() and "rank 1 bound to" in output.lower(), output
    assert_no_strays(bed)


def test_dry_run_line(run_mpi_env: MpiEnv, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    result = subprocess.run(run_mpi_env.dtlaunch_argv("run", "--dry-run", "-H", "h1:1,h2:1",
                                                      "--iface", "eth0", str(script)),
                            capture_output=True, text=True, env=run_mpi_env.environ(), timeout=60)
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout)
    # Every option in the double-dash form: Open MPI 5's prterun refuses `-bind-to`.
    for pair in (["--bind-to", "none"], ["--map-by", "slot"]):
        assert any(argv[i:i + 2] == pair for i in range(len(argv))), result.stdout
    single_dash = {"-bind-to", "-map-by", "-mca", "-tag-output", "-oversubscribe",
                   "-leave-session-attached", "-allow-run-as-root"}
    assert not single_dash & set(argv), result.stdout
    btl = argv[argv.index("btl") + 1]
    assert btl == ("self,sm,tcp" if run_mpi_env.id == "openmpi5" else "self,vader,tcp")
    assert argv[-2:] == [run_mpi_env.python, str(script)]


def test_a_one_machine_launcher_set_by_the_environment_is_left_out(
        bed: TestBed, run_mpi_env: MpiEnv, tmp_path: Path) -> None:
    """Images built for one machine set OMPI_MCA_plm=isolated. mpirun typed by hand then maps
    every rank to this machine and stops; dtlaunch leaves the variable out, says so, and the
    job runs on both hosts."""
    stray = {"OMPI_MCA_plm": "isolated"}
    if run_mpi_env.id == "openmpi4":
        hand = subprocess.run(
            [run_mpi_env.launcher, "--allow-run-as-root", "-np", "2", "-H", "h1:1,h2:1",
             "--mca", "plm_rsh_args", f"-F {bed.ssh_config}", "hostname"],
            capture_output=True, text=True, env={**run_mpi_env.environ(), **stray}, timeout=60)
        assert hand.returncode != 0
        assert "already filled" in hand.stdout + hand.stderr, hand.stdout + hand.stderr
    result = dtl(run_mpi_env, bed, "run", "-H", "h1:1,h2:1", "--iface", bed.subnet, PROBE,
                 "--out", str(tmp_path), extra_env=stray)
    assert result.returncode == 0, result.stderr
    assert [records(tmp_path)[r]["host"] for r in (0, 1)] == ["h1", "h2"]
    assert ("OMPI_MCA_plm=isolated (from the environment) picks a launcher other than ssh for "
            "mpirun; left out of its environment") in result.stderr, result.stderr
    assert_no_strays(bed)


def test_a_one_machine_launcher_in_a_parameter_file_is_overridden(
        bed: TestBed, run_mpi_env: MpiEnv, tmp_path: Path) -> None:
    """plm = isolated in the user's parameter file (ORTE's ~/.openmpi, PRRTE's ~/.prte): the
    hand-typed mpirun fails; dtlaunch names ssh's launcher on the command line, says why, and
    the job runs on both hosts. Named on the command line by the user (--mpi-args), the same
    choice is kept, and mpirun's refusal becomes one line."""
    five = run_mpi_env.id == "openmpi5"
    home = tmp_path / "home"
    (home / (".prte" if five else ".openmpi")).mkdir(parents=True)
    (home / (".prte" if five else ".openmpi") / "mca-params.conf").write_text("plm = isolated\n")
    env = {"HOME": str(home), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    hand = subprocess.run(
        [run_mpi_env.launcher, "--allow-run-as-root", "-np", "2", "-H", "h1:1,h2:1",
         "--mca", "plm_rsh_args", f"-F {bed.ssh_config}", "hostname"],
        capture_output=True, text=True, env={**run_mpi_env.environ(), **env}, timeout=60)
    said = hand.stdout + hand.stderr
    assert hand.returncode != 0
    assert ("No available launching agents" if five else "already filled") in said, said
    out, none = tmp_path / "out", tmp_path / "none"
    out.mkdir()
    none.mkdir()
    result = dtl(run_mpi_env, bed, "run", "-H", "h1:1,h2:1", "--iface", bed.subnet, PROBE,
                 "--out", str(out), extra_env=env)
    assert result.returncode == 0, result.stderr
    assert [records(out)[r]["host"] for r in (0, 1)] == ["h1", "h2"]
    assert "plm = isolated (a parameter file) picks a launcher other than ssh for mpirun; " \
        "overridden on its command line" in result.stderr, result.stderr
    theirs = dtl(run_mpi_env, bed, "run", "-H", "h1:1,h2:1", "--iface", bed.subnet,
                 "--mpi-args", "--mca plm isolated", PROBE, "--out", str(none),
                 extra_env=env)
    assert theirs.returncode != 0 and "Traceback" not in theirs.stderr
    assert theirs.stderr.strip().splitlines()[-1].startswith(
        "dtlaunch: job failed: mpirun found no launcher it can use (plm = isolated" if five
        else "dtlaunch: job failed: mpirun found every slot it may use already filled"), \
        theirs.stderr
    assert not records(none)
    assert_no_strays(bed)


def test_preflight_checks_the_venvs_mpi_on_every_host(bed: TestBed, run_mpi_env: MpiEnv,
                                                      tmp_path: Path) -> None:
    """With the checks on, the job's own mpirun path is what each host is asked about."""
    result = dtl(run_mpi_env, bed, "doctor", "-H", "h1,h2", "--iface", bed.subnet, "--json",
                 check=True)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    for host in report["hosts"]:
        checks = {c["name"]: c for c in host["checks"]}
        assert checks["mpirun"]["detail"] == run_mpi_env.launcher, checks["mpirun"]
        if run_mpi_env.id in VERSIONS:
            assert VERSIONS[run_mpi_env.id].endswith(checks["mpi"]["detail"])
    run = dtl(run_mpi_env, bed, "run", "-H", "h1:1,h2:1", "--iface", bed.subnet, PROBE,
              "--out", str(tmp_path), "--horovod", check=True)
    assert run.returncode == 0, run.stderr
    assert sorted(records(tmp_path)) == [0, 1]


def test_a_host_key_changed_since_a_cached_preflight_is_named(make_bed, run_mpi_env: MpiEnv,
                                                              tmp_path: Path) -> None:
    """With the pre-flight cache on: the success is cached; a host key changed since then is
    refused by the launcher's ssh, the job fails at its start, and the keys checked then name
    the host (no hang)."""
    bed = make_bed(2)
    env = {k: v for k, v in run_mpi_env.environ().items() if k != "DTLAUNCH_PREFLIGHT_CACHE"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    argv = run_mpi_env.dtlaunch_argv("run", "--ssh-config", str(bed.ssh_config), "-H",
                                     "h1:1,h2:1", "--iface", bed.subnet, PROBE, "--out",
                                     str(tmp_path))
    run = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=180)
    assert run.returncode == 0, run.stderr
    assert sorted(records(tmp_path)) == [0, 1]
    bed.restart_with_new_host_key("h2")
    again = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 1, again.stderr
    assert "pre-flight checks failed: h2 (ssh); the job did not start" in again.stderr
    assert_no_strays(bed)


def test_signals_end_the_job_everywhere(bed: TestBed, run_mpi_env: MpiEnv,
                                        tmp_path: Path) -> None:
    for sig, expected in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        out = tmp_path / sig.name
        out.mkdir()
        proc = start_sleeping_job(run_mpi_env, bed, out)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=HANG)
        assert proc.returncode == expected, err
        assert_no_strays(bed, pids=tuple(r["pid"] for r in records(out).values()))


def test_lost_host_ends_the_job(make_bed, run_mpi_env: MpiEnv, tmp_path: Path) -> None:
    testbed: TestBed = make_bed(2)
    proc = start_sleeping_job(run_mpi_env, testbed, tmp_path)
    testbed.kill_all_sshd("h2")
    _, err = proc.communicate(timeout=HANG)
    assert proc.returncode != 0
    assert err.splitlines()[-1] == "dtlaunch: job failed: lost the SSH connection to host h2", err
    # h1's rank ends with its daemon when it sees its ssh link close, which may be just after
    # dtlaunch's exit (mpirun ends at once on h2's loss).
    assert not survivors(lambda: testbed.stray_pids("h1"))


# --- MPICH: Horovod's build proven by Hydra's own mpiexec, without dtlaunch ----------------------


def test_mpich_horovod_allreduce_by_hand_written_mpiexec(bed: TestBed, tmp_path: Path) -> None:
    from helpers.mpi_envs import make_mpi_env

    mpi = make_mpi_env("mpich")
    ssh = tmp_path / "ssh-bed"  # -launcher-exec takes one executable, not a command line
    ssh.write_text(f"#!/bin/sh\nexec ssh -F {shlex.quote(str(bed.ssh_config))} \"$@\"\n")
    ssh.chmod(0o755)
    h1, h2 = bed.host("h1"), bed.host("h2")
    # From inside h1: Hydra's proxies connect back to the launcher's address on eth0.
    argv = [mpi.launcher, "-n", "2", "-hosts", f"{h1.address}:1,{h2.address}:1",
            "-launcher", "ssh", "-launcher-exec", str(ssh), "-iface", "eth0", "-prepend-rank",
            mpi.python, PROBE, "--out", str(tmp_path), "--horovod"]
    result = subprocess.run(bed.nsenter_argv("h1", argv), capture_output=True, text=True,
                            env=mpi.environ(), timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    found = records(tmp_path)
    assert sorted(found) == [0, 1]
    assert [found[r]["host"] for r in (0, 1)] == ["h1", "h2"]
    assert all(r["allreduce_sum"] == 3.0 for r in found.values())
    assert_no_strays(bed)


def test_horovod_is_built_for_each_mpi(mpi_env: MpiEnv) -> None:
    """Each interpreter's Horovod loads that MPI's library, not another one on the machine."""
    # Importing horovod.torch loads its MPI extension and with it the libmpi it links to.
    code = ("import horovod.torch; "
            "print([l.split()[-1] for l in open('/proc/self/maps') if '/libmpi' in l][0])")
    result = subprocess.run([mpi_env.python, "-c", code], capture_output=True, text=True,
                            env=mpi_env.environ(), timeout=120)
    assert result.returncode == 0, result.stderr
    lib = result.stdout.strip().splitlines()[-1]
    if mpi_env.bin_dir is None:
        assert lib.startswith("/usr/lib/") and str(MPI_VENVS) not in lib, lib  # Debian's
    else:
        assert os.path.realpath(lib).startswith(os.path.realpath(Path(mpi_env.bin_dir).parent)), lib
