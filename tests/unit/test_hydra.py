"""Hydra's family (MPICH, Intel MPI): the argv, the ssh agent, versions, output and failures."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from helpers.mpis import INTEL, fake_mpi, spec
from helpers.procs import assert_kill_leaves_no_sleeper
from helpers.records import record
from hypothesis import given
from hypothesis import strategies as st

from dtlaunch.agents import rsh
from dtlaunch.agents.rank_shim import EXIT, STDOUT
from dtlaunch.agents.rank_shim import HOST as HOST_RECORD
from dtlaunch.check.facts import HostFacts
from dtlaunch.check.host_checks import check_mpirun
from dtlaunch.check.mpi_checks import check_mpi
from dtlaunch.check.report import FAIL, HOST, PASS, CheckResult
from dtlaunch.core.errors import DtlaunchError, UsageError
from dtlaunch.core.records import Piece, RankExit, RankHost
from dtlaunch.hydra.family import HYDRA, Hydra, agent_path, agent_script, build_mpiexec_argv
from dtlaunch.hydra.output import HydraDemux, analyze_hydra
from dtlaunch.job.env import EnvPlan, plan_environment
from dtlaunch.job.hosts import Host
from dtlaunch.mpi import Interfaces, MpiImpl, parse_mpirun_version
from dtlaunch.mpijob import launcher_choice
from dtlaunch.openmpi.family import OPEN_MPI
from dtlaunch.plan.plan import RunRequest
from dtlaunch.reach.ssh_options import SshOptions
from dtlaunch.run import session
from dtlaunch.run.execute import LaunchResult, first_failed_rank, write_private_executable

MPICH_5 = """HYDRA build details:
    Version:                                 5.0.2
    Release Date:                            Fri Sep 25 20:45:26 UTC 2026
    CC:                              cc
    Launchers available:                     ssh rsh fork slurm ll lsf sge manual persist
"""
MPICH_3 = "HYDRA build details:\n    Version:                                 3.3a2\n    Release Date: unreleased development copy\n"
MPICH_4 = "HYDRA build details:\n    Version:                                 4.0.2\n    Release Date:  Thu Apr  7 12:34:45 CDT 2022\n"
OMPI = "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n"




def test_argv_two_hosts() -> None:
    assert build_mpiexec_argv(spec(), "mpiexec", "/cache/hydra-ssh-1") == (
        "mpiexec", "-n", "4", "-hosts", "h1:2,h2:2", "-launcher", "ssh",
        "-launcher-exec", "/cache/hydra-ssh-1", "-iface", "eth0", "-prepend-rank",
        "-genvlist", "PATH,API_TOKEN", "-genv", "PYTHONUNBUFFERED", "1",
        "-genv", "FI_TCP_IFACE", "eth0", "/venv/bin/python", "train.py", "--lr", "1",
    )


def test_secret_values_never_on_the_command_line() -> None:
    argv = HYDRA.build_argv(spec(), "mpiexec")
    assert "s3cr3t" not in " ".join(argv)
    assert "API_TOKEN" in argv[argv.index("-genvlist") + 1].split(",")


def test_no_variables_exports_nothing_and_no_iface() -> None:
    argv = build_mpiexec_argv(spec(env=EnvPlan(()), iface=None))
    assert "-genvnone" in argv and "-genvlist" not in argv and "-iface" not in argv


def test_slurm_uses_hydra_srun_launcher_and_extra_args_come_before_program() -> None:
    argv = build_mpiexec_argv(spec(via="slurm", mpi_args=("-bind-to", "core")))
    assert argv[5:7] == ("-launcher", "slurm") and "-launcher-exec" not in argv
    assert argv[-6:-4] == ("-bind-to", "core")


def test_cidr_is_refused_in_one_line() -> None:
    with pytest.raises(UsageError, match="interface name, not a subnet"):
        HYDRA.build_argv(spec(iface=Interfaces(cidrs=("10.0.0.0/24",))), "mpiexec")


def test_agent_is_named_by_its_content() -> None:
    family = Hydra("/cache/bin", "/venv/bin/python", "/pkg/dtlaunch/agents/rsh.py")
    files = family.support_files(spec())
    assert len(files) == 1
    path, text = files[0]
    assert family.build_argv(spec(), "mpiexec")[8] == path
    assert text.startswith("#!/venv/bin/python -IS\n") and "StrictHostKeyChecking=yes" in text
    other = family.support_files(spec(ssh=SshOptions(port=2222)))[0]
    assert other[0] != path and "'-p', '2222'" in other[1]
    assert family.support_files(spec(via="slurm")) == ()
    assert path == agent_path("/cache/bin", text)


def test_agent_runs_ssh_with_the_options_before_hydras_arguments(tmp_path: Path) -> None:
    """The real agent file, run as Hydra runs it, with a stand-in ssh that records its argv."""
    fake = tmp_path / "bin" / "ssh"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\nexit 255\n')
    fake.chmod(0o755)
    text = agent_script(os.path.realpath(sys.executable), rsh.__file__ or "",
                        SshOptions(config_file="/etc/cfg").ssh_args())
    agent = tmp_path / "cache" / "hydra-ssh-x"
    write_private_executable(str(agent), text)
    assert stat.S_IMODE(agent.stat().st_mode) == 0o700
    out = subprocess.run([str(agent), "-x", "h2", "/venv/bin/hydra_pmi_proxy", "--proxy-id", "1"],
                         capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{fake.parent}:/usr/bin:/bin"})
    words = out.stdout.split("\n")
    if words[:2] == ["-v", "-E"]:  # the wrapper's private log, to tell a lost link (rsh.py)
        words = words[3:]
    assert words[:2] == ["-o", "BatchMode=yes"]
    assert out.stdout.split("\n")[-6:-1] == ["-x", "h2", "/venv/bin/hydra_pmi_proxy", "--proxy-id", "1"]
    assert "-F\n/etc/cfg" in out.stdout
    # ssh's 255 is a lost link: the wrapper names the host, as it does for Open MPI.
    assert out.returncode == 255
    assert out.stderr == f"{rsh.LOST_PREFIX}h2 (ssh exit status 255)\n"


def test_agent_ends_its_ssh_when_mpiexec_is_killed(tmp_path: Path) -> None:
    """Hydra starts its launcher in a session of its own, which dtlaunch's final SIGKILL of
    mpiexec's session does not reach: the agent must end its ssh when mpiexec dies."""
    fake = tmp_path / "bin" / "ssh"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexec sleep 3174\n")  # an ssh link that stays up
    fake.chmod(0o755)
    agent = tmp_path / "cache" / "hydra-ssh-x"
    write_private_executable(str(agent), agent_script(os.path.realpath(sys.executable),
                                                 rsh.__file__ or "", ()))
    # mpiexec's stand-in: starts the agent in a new session, as Hydra does, and waits.
    mpiexec = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.Popen(sys.argv[1:], "
         "start_new_session=True).wait()", str(agent), "-x", "h2", "hydra_pmi_proxy"],
        env={"PATH": f"{fake.parent}:/usr/bin:/bin"})
    assert_kill_leaves_no_sleeper(mpiexec, "3174", 30, "the agent never ran ssh",
                                  "ssh outlived a killed mpiexec")


@pytest.mark.parametrize(("text", "name", "version", "release"), [
    (MPICH_5, "MPICH", "5.0.2", (5, 0, 2)),
    (MPICH_4, "MPICH", "4.0.2", (4, 0, 2)),
    (MPICH_3, "MPICH", "3.3a2", (3, 3)),
    (INTEL, "Intel MPI", "2021.10", (2021, 10)),
])
def test_hydra_versions(text: str, name: str, version: str, release: tuple[int, ...]) -> None:
    impl = parse_mpirun_version(text)
    assert (impl.name, impl.version, impl.release) == (name, version, release)
    assert HYDRA.unsupported(impl, "mpiexec") is None
    assert OPEN_MPI.unsupported(impl, "mpirun") is not None


def test_hydra_refuses_open_mpi_and_old_mpich() -> None:
    assert "not MPICH or Intel MPI" in (HYDRA.unsupported(parse_mpirun_version(OMPI), "mpirun") or "")
    assert "needs >= 3.0" in (HYDRA.unsupported(MpiImpl("MPICH", "1.4.1"), "mpiexec") or "")


def _records_through_hydra(chunks: list[tuple[int, bytes]]) -> bytes:
    """What mpiexec -prepend-rank prints for these chunks, read by the proxies in this order:
    `[RANK] ` before each chunk and after each newline inside one."""
    out = b""
    for rank, chunk in chunks:
        body = chunk[:-1].replace(b"\n", b"\n" + f"[{rank}] ".encode()) + chunk[-1:]
        out += f"[{rank}] ".encode() + body
    return out


def test_demux_joins_records_cut_by_hydra_and_keeps_its_own_lines() -> None:
    one = record(0, STDOUT, b"hello from 0\n")
    two = record(1, STDOUT, b"x" * 3000) + record(1, EXIT, b"exit 3")
    stream = _records_through_hydra([(0, record(0, HOST_RECORD, b"h1") + one[:9]), (1, two[:100]),
                                     (0, one[9:]), (1, two[100:])])
    stream = b"[mpiexec@h1] Sending Ctrl-C to processes as requested\n" + stream
    demux = HydraDemux("stdout")
    events: list[object] = []
    for cut in range(0, len(stream), 7):  # the pipe may cut anywhere, tags included
        events += demux.feed(stream[cut:cut + 7])
    events += demux.flush()
    assert events == [Piece(None, "stdout", b"[mpiexec@h1] Sending Ctrl-C to processes as requested\n"),
                      RankHost(0, "h1"), Piece(0, "stdout", b"hello from 0\n"),
                      Piece(1, "stdout", b"x" * 3000), RankExit(1, "exit 3")]


@given(st.lists(st.sampled_from([b"[", b"0", b"1", b"] ", b"a", b"\n", b"\x1edtl2 ", b"o "]),
                max_size=40), st.integers(1, 9))
def test_demux_never_crashes_and_loses_nothing_untagged(parts: list[bytes], step: int) -> None:
    data = b"".join(parts)
    demux = HydraDemux("stderr")
    events = [e for cut in range(0, len(data), step) for e in demux.feed(data[cut:cut + step])]
    events += demux.flush()
    if b"[" not in data and b"\x1e" not in data:
        assert b"".join(e.data for e in events if isinstance(e, Piece)) == data


BANNER = """
===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   PID 14860 RUNNING AT h2
=   EXIT CODE: {code}
=   CLEANING UP REMAINING PROCESSES
=   YOU CAN IGNORE THE BELOW CLEANUP MESSAGES
===================================================================================
""".splitlines()


def test_bad_termination_names_host_and_the_rank_when_alone_there() -> None:
    failure = analyze_hydra([line.format(code=3) for line in BANNER], ["h1", "h2"])
    assert failure is not None and failure.describe() == "rank 1 on host h2 exited with code 3"
    failure = analyze_hydra([line.format(code=3) for line in BANNER], ["h1", "h2", "h2"])
    assert failure is not None and failure.describe() == "a process on host h2 exited with code 3"


def test_bad_termination_by_a_signal() -> None:
    failure = analyze_hydra([line.format(code=9) for line in BANNER], ["h1", "h2"])
    assert failure is not None
    assert failure.describe() == ("rank 1 on host h2 ended with code 9 (or was killed by "
                                  "signal 9, SIGKILL)")
    lines = [line.format(code=11) for line in BANNER]
    lines.insert(6, "=   YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Segmentation fault (signal 11)")
    failure = analyze_hydra(lines, ["h1", "h2"])
    assert failure is not None and failure.describe() == "rank 1 on host h2 was killed by signal 11 (SIGSEGV)"


def test_abort_and_ssh_failures() -> None:
    failure = analyze_hydra(["application called MPI_Abort(MPI_COMM_WORLD, 7) - process 2"],
                            ["h1", "h1", "h2"])
    assert failure is not None and failure.describe() == "rank 2 on host h2 exited with code 7"
    failure = analyze_hydra([
        "Host key verification failed.",
        "[mpiexec@h1] HYDT_bscu_wait_for_completion (bscu_wait.c:109): one of the processes "
        "terminated badly; aborting"], ["h1", "h2"])
    assert failure is not None and "Host key verification failed." in failure.describe()
    assert analyze_hydra(["nothing to see"], ["h1"]) is None




def test_family_follows_the_mpi_first_on_path(tmp_path: Path) -> None:
    fake_mpi(tmp_path / "mpich", MPICH_5)
    fake_mpi(tmp_path / "ompi", OMPI, ("mpirun",))
    fake_mpi(tmp_path / "intel", INTEL, ("mpiexec",))
    env = {"HOME": str(tmp_path), "PATH": f"{tmp_path / 'mpich'}:{tmp_path / 'ompi'}"}
    family, program, impl = launcher_choice.launcher_family(env)
    assert isinstance(family, Hydra) and impl == MpiImpl("MPICH", "5.0.2")
    assert program == str(tmp_path / "mpich" / "mpiexec")
    assert family.agent_dir == str(tmp_path / ".cache" / "dtlaunch" / "bin")
    family, program, impl = launcher_choice.launcher_family({"PATH": f"{tmp_path / 'ompi'}:{tmp_path / 'mpich'}"})
    assert family is OPEN_MPI and program == str(tmp_path / "ompi" / "mpirun")
    family, program, impl = launcher_choice.launcher_family({"PATH": str(tmp_path / "intel")})
    assert isinstance(family, Hydra) and impl is not None and impl.name == "Intel MPI"
    assert launcher_choice.launcher_family({"PATH": str(tmp_path / "none")}) == (OPEN_MPI, None, None)


def test_doctor_asks_the_hosts_about_hydras_mpiexec(tmp_path: Path) -> None:
    """Intel MPI's mpirun is a script that finds mpiexec.hydra on PATH (absent on a remote
    login's): doctor asks each host about the mpiexec the job starts, as run's pre-flight does."""
    fake_mpi(tmp_path / "intel", INTEL)
    fake_mpi(tmp_path / "ompi", OMPI, ("mpirun", "mpiexec"))
    assert launcher_choice.job_launcher({"PATH": str(tmp_path / "intel")}) == \
        str(tmp_path / "intel" / "mpiexec")
    assert launcher_choice.job_launcher({"PATH": str(tmp_path / "ompi")}) == \
        str(tmp_path / "ompi" / "mpirun")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "mpirun").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "broken" / "mpirun").chmod(0o755)  # answers nothing: still the one asked about
    assert launcher_choice.job_launcher({"PATH": str(tmp_path / "broken")}) == \
        str(tmp_path / "broken" / "mpirun")
    assert launcher_choice.job_launcher({"PATH": str(tmp_path / "none")}) == ""


def _facts(impl: MpiImpl, orted: str | None = None) -> HostFacts:
    return HostFacts(hostname="h2", mpirun="/opt/mpi/bin/mpirun", orted=orted, mpi=impl)


MPICH = MpiImpl("MPICH", "5.0.2")
OMPI_4 = MpiImpl("Open MPI", "4.1.4")


def test_doctor_names_an_mpich_host_in_an_open_mpi_job_with_its_fix() -> None:
    check = check_mpi(_facts(MPICH), OMPI_4)
    assert check.status == FAIL
    assert check.detail == ("/opt/mpi/bin/mpirun is MPICH 5.0.2; this machine's mpirun is "
                            "Open MPI 4.1.4, whose daemons this host cannot run")
    assert check.hint.startswith("put Open MPI 4.1.4's bin directory first on this host's PATH")


def test_doctor_names_an_open_mpi_host_in_an_mpich_job_with_its_fix() -> None:
    check = check_mpi(_facts(OMPI_4, orted="/usr/bin/orted"), MPICH)
    assert check.status == FAIL
    assert check.detail == "/opt/mpi/bin/mpirun is Open MPI 4.1.4; this machine's mpiexec is MPICH 5.0.2"
    assert check.hint.startswith("install MPICH 5.0.2 on this host at this machine's mpiexec path")
    other = check_mpi(_facts(MpiImpl("MPICH", "4.1")), MPICH)
    assert (other.status, other.detail) == (FAIL, "MPICH 4.1 here, MPICH 5.0.2 on this machine")
    intel = check_mpi(_facts(MpiImpl("Intel MPI", "2021.10")), MPICH)
    assert intel.status == FAIL and "Intel MPI 2021.10 here" in intel.detail


def test_same_mpich_everywhere_passes_without_orted() -> None:
    assert check_mpi(_facts(MPICH), MPICH) == CheckResult("mpi", PASS, "MPICH 5.0.2")
    assert check_mpirun(_facts(MPICH), HOST, needs_orted=False).status == PASS
    assert check_mpirun(_facts(MPICH), HOST).status == FAIL  # an Open MPI job needs orted
    # env-check judges this machine alone: MPICH and Intel MPI are supported, others are not.
    assert check_mpi(_facts(MPICH), None).status == PASS
    assert check_mpi(_facts(MpiImpl("unknown", "")), None).status == FAIL


def test_first_failed_rank_from_the_exit_records() -> None:
    exits = {0: "exit 0", 2: "signal 9", 1: "exit 3"}
    failure = first_failed_rank(exits, ["h1", "h2", "h2"])
    assert failure is not None and failure.describe() == "rank 2 on host h2 was killed by signal 9 (SIGKILL)"
    failure = first_failed_rank({0: "exit 0", 1: "exit 3"}, ["h1", "h2"])
    assert failure is not None and failure.describe() == "rank 1 on host h2 exited with code 3"
    assert first_failed_rank({0: "exit 0", 1: "odd"}, ["h1", "h2"]) is None


def test_agent_folder_writable_by_others_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "bin"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    with pytest.raises(DtlaunchError, match="is not yours alone"):
        write_private_executable(str(folder / "hydra-ssh-x"), "#!/bin/sh\n")


def test_tree_spawn_is_refused_and_mpich_settings_reach_the_ranks() -> None:
    with pytest.raises(UsageError, match="--tree-spawn"):
        HYDRA.build_argv(spec(tree_spawn=True), "mpiexec")
    environ = {"MPIR_CVAR_CH4_NETMOD": "ofi", "I_MPI_FABRICS": "shm"}
    assert plan_environment(environ).names() == ("I_MPI_FABRICS", "MPIR_CVAR_CH4_NETMOD")


def test_launch_with_mpich_first_on_path_starts_mpiexec_with_its_agent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole flow up to the executor: Hydra's family, its argv, its agent file to write."""
    fake_mpi(tmp_path / "mpich", MPICH_5)
    monkeypatch.setenv("PATH", f"{tmp_path / 'mpich'}:{os.environ.get('PATH', '')}")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("API_TOKEN", "s3cr3t")
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    calls: list[tuple[tuple[str, ...], dict[str, object]]] = []

    def executor(argv: Sequence[str], env: Mapping[str, str], rank_hosts: Sequence[str],
                 **kw: object) -> LaunchResult:
        calls.append((tuple(argv), kw))
        return LaunchResult(0, None)

    run = RunRequest(hosts=(Host("h1"), Host("h2")), python=sys.executable, script=str(script),
                     env_items=("API_TOKEN",), iface=Interfaces(names=("eth0",)))
    outcome = session.launch(session.LaunchRequest(run, check=False), lambda e: None,
                             executor=executor)
    assert outcome.exit_code == 0 and isinstance(outcome.plan.family, Hydra)
    (argv, kw), = calls
    assert argv[0] == str(tmp_path / "mpich" / "mpiexec")
    assert argv[1:5] == ("-n", "2", "-hosts", "h1:1,h2:1")
    agent = argv[argv.index("-launcher-exec") + 1]
    assert agent.startswith(str(tmp_path / ".cache" / "dtlaunch" / "bin" / "hydra-ssh-"))
    files = kw["support_files"]
    assert isinstance(files, tuple) and [path for path, _ in files] == [agent]
    assert kw["family"] is outcome.plan.family
    assert "s3cr3t" not in " ".join(argv) and "API_TOKEN" in argv[argv.index("-genvlist") + 1]
    assert outcome.plan.display().startswith("mpiexec -n 2 -hosts h1:1,h2:1 -launcher ssh ")


def test_hydra_launcher_overrides_are_not_left_to_dtlaunch() -> None:
    from dtlaunch.hydra.family import HYDRA

    assert HYDRA.ssh_left_to_dtlaunch(("-genv", "X", "1"), {"PATH": "/bin"})
    assert not HYDRA.ssh_left_to_dtlaunch(("-launcher-exec", "/bin/rsh"), {})
    assert not HYDRA.ssh_left_to_dtlaunch((), {"HYDRA_LAUNCHER_EXEC": "ssh -o X=y"})
    assert not HYDRA.ssh_left_to_dtlaunch((), {"I_MPI_HYDRA_BOOTSTRAP": "rsh"})
