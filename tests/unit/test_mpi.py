from __future__ import annotations

from dataclasses import replace

import pytest
from helpers.records import record
from hypothesis import given
from hypothesis import strategies as st

from dtlaunch.core.errors import UsageError
from dtlaunch.core.records import Piece
from dtlaunch.job.env import EnvPlan, EnvVar
from dtlaunch.job.hosts import Host
from dtlaunch.mpi import (
    Interfaces,
    JobSpec,
    MpiImpl,
    parse_iface,
    parse_mpirun_version,
    split_mpi_args,
)
from dtlaunch.openmpi.family import OPEN_MPI, build_mpirun_argv
from dtlaunch.reach.ssh_options import SshOptions

SSH_DEFAULT = ("-o BatchMode=yes -o ConnectTimeout=10 -o StrictHostKeyChecking=yes "
               "-o ServerAliveInterval=5 -o ServerAliveCountMax=3")


def test_two_hosts_iface_name_as_root() -> None:
    spec = JobSpec(
        hosts=(Host("host1", 1), Host("host2", 1)),
        num_proc=2,
        program=("/venv/bin/python", "train.py", "--lr", "1"),
        env=EnvPlan((EnvVar("PATH", "/usr/bin"), EnvVar("NCCL_SOCKET_IFNAME", "ens3", inline=True))),
        iface=Interfaces(names=("ens3",)),
        as_root=True,
    )
    assert build_mpirun_argv(spec) == (
        "mpirun", "--allow-run-as-root", "--tag-output", "-np", "2", "-H", "host1:1,host2:1",
        "--bind-to", "none", "--map-by", "slot", "--mca", "pml", "ob1", "--mca", "btl", "self,vader,tcp",
        "--mca", "btl_tcp_if_include", "ens3", "--mca", "oob_tcp_if_include", "ens3",
        "--leave-session-attached",
        "--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args", SSH_DEFAULT,
        "--mca", "plm_rsh_no_tree_spawn", "1",
        "-x", "PATH", "-x", "NCCL_SOCKET_IFNAME=ens3",
        "/venv/bin/python", "train.py", "--lr", "1",
    )


def test_cidr_ssh_options_open_mpi_5_tree_spawn_non_root() -> None:
    spec = JobSpec(
        hosts=(Host("a", 4),),
        num_proc=6,
        program=("python", "-m", "pkg.train"),
        iface=Interfaces(cidrs=("10.0.0.0/24",)),
        ssh=SshOptions(port=2222, identity_file="/k/id", config_file="/k/cfg", connect_timeout=3,
                       host_key_policy="accept-new"),
        oversubscribe=True,
        tree_spawn=True,
        mpi_version=(5, 0, 3),
        mpi_args=("--report-bindings",),
        rsh_agent="/venv/bin/python -m dtlaunch.agents.rsh",
    )
    assert build_mpirun_argv(spec, "/opt/ompi/bin/mpirun") == (
        "/opt/ompi/bin/mpirun", "--tag-output", "-np", "6", "-H", "a:4",
        "--bind-to", "none", "--map-by", "slot", "--oversubscribe",
        "--mca", "pml", "ob1", "--mca", "btl", "self,sm,tcp",
        "--mca", "btl_tcp_if_include", "10.0.0.0/24", "--mca", "oob_tcp_if_include", "10.0.0.0/24",
        "--leave-session-attached",
        # Tree spawn runs the agent on remote hosts too, so it stays plain ssh there.
        "--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args",
        "-o BatchMode=yes -o ConnectTimeout=3 -o StrictHostKeyChecking=accept-new "
        "-o ServerAliveInterval=5 -o ServerAliveCountMax=3 -p 2222 -i /k/id -F /k/cfg",
        "--report-bindings", "python", "-m", "pkg.train",
    )


def test_rsh_agent_used_without_tree_spawn() -> None:
    spec = JobSpec(hosts=(Host("a"),), num_proc=1, program=("p", "s.py"), rsh_agent="w -m x")
    argv = build_mpirun_argv(spec)
    assert argv[argv.index("plm_rsh_agent") + 1] == "w -m x"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("ens3", Interfaces(names=("ens3",))), ("eth0,ib0", Interfaces(names=("eth0", "ib0"))),
     ("10.0.0.7/24", Interfaces(cidrs=("10.0.0.0/24",)))],
)
def test_parse_iface(spec: str, expected: Interfaces) -> None:
    assert parse_iface(spec) == expected


@pytest.mark.parametrize("spec", ["", "eth0,", "10.0.0.0/33", "eth0,10.0.0.0/8", "fe80::/64",
                                  "a very long interface name", "-x"])
def test_bad_iface(spec: str) -> None:
    with pytest.raises(UsageError):
        parse_iface(spec)


def test_mpi_args_split_like_a_shell() -> None:
    assert split_mpi_args("--mca x 'a b' \"c\"") == ("--mca", "x", "a b", "c")
    with pytest.raises(UsageError, match="--mpi-args"):
        split_mpi_args("--mca 'unbalanced")


@pytest.mark.parametrize(
    ("text", "name", "version"),
    [
        ("mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/", "Open MPI", "4.1.4"),
        ("mpirun (Open MPI) 5.0.3", "Open MPI", "5.0.3"),
        ("mpirun (Open MPI) 2.1.1", "Open MPI", "2.1.1"),
        ("mpiexec (OpenRTE) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/",
         "Open MPI", "4.1.4"),
        ("HYDRA build details:\n    Version:                                 4.0\n", "MPICH", "4.0"),
        ("Intel(R) MPI Library for Linux* OS, Version 2021.9 Build 2023", "Intel MPI", "2021.9"),
        ("/venv/bin/mpirun: 109: mpiexec.hydra: not found", "unknown", ""),
        ("something else", "unknown", ""),
    ],
)
def test_parse_mpirun_version(text: str, name: str, version: str) -> None:
    impl = parse_mpirun_version(text)
    assert (impl.name, impl.version) == (name, version)


@pytest.mark.parametrize(
    ("version", "release"),
    [("4.1.4", (4, 1, 4)), ("5.0.0rc12", (5, 0, 0)), ("4.1.5a1", (4, 1, 5)), ("2021.9", (2021, 9)),
     ("3.0", (3, 0)), ("", ()), ("v4.x-dev", ())],
)
def test_versions_are_read_one_way(version: str, release: tuple[int, ...]) -> None:
    assert MpiImpl("Open MPI", version).release == release


def test_open_mpi_family_refuses_what_it_cannot_drive() -> None:
    assert OPEN_MPI.unsupported(parse_mpirun_version("mpirun (Open MPI) 4.1.4"), "mpirun") is None
    assert OPEN_MPI.unsupported(parse_mpirun_version("mpirun (Open MPI) 5.0.0rc12"), "m") is None
    old = OPEN_MPI.unsupported(parse_mpirun_version("mpirun (Open MPI) 2.1.1"), "/o/mpirun")
    assert old == "/o/mpirun is Open MPI 2.1.1; dtlaunch needs >= 3.0"
    other = OPEN_MPI.unsupported(MpiImpl("MPICH", "4.0"), "mpirun")
    assert other == "mpirun is MPICH, not Open MPI; dtlaunch needs Open MPI >= 3.0"
    assert OPEN_MPI.unsupported(MpiImpl("Open MPI", "junk"), "mpirun") is not None


def test_open_mpi_family_reads_its_output_and_failures() -> None:
    demux = OPEN_MPI.new_demux("stdout")
    events = demux.feed(b"[1,0]<stdout>:" + record(0, "o", b"hello\n") + b"mpirun's own\n")
    assert events == [Piece(0, "stdout", b"hello\n"), Piece(None, "stdout", b"mpirun's own\n")]
    failure = OPEN_MPI.parse_failure(
        ["Process name: [[1234,1],1]", "Exit code:    3"], ["h1", "h2"])
    assert failure is not None and (failure.rank, failure.host, failure.exit_code) == (1, "h2", 3)
    assert OPEN_MPI.ssh_left_to_dtlaunch(("--mca", "btl_tcp_eager_limit", "1"), {})
    assert not OPEN_MPI.ssh_left_to_dtlaunch(("--mca", "plm_rsh_args", "-o X=y"), {})
    argv = OPEN_MPI.build_argv(JobSpec(hosts=(Host("a"),), num_proc=1, program=("p",)), "mpirun")
    # Open MPI 5's prterun rejects the single-dash long options.
    assert not {"-bind-to", "-map-by", "-mca"} & set(argv)


@given(st.text(max_size=60))
def test_iface_parser_never_crashes(text: str) -> None:
    try:
        parse_iface(text)
    except UsageError as exc:
        assert "\n" not in str(exc)


def test_binding_args_reach_open_mpi_in_the_double_dash_forms_every_version_takes() -> None:
    spec = JobSpec(hosts=(Host("a", 2),), num_proc=2, program=("p",),
                   binding=("-bind-to", "core", "-map-by", "core", "-report-bindings"),
                   mpi_version=(5, 0, 11))
    argv = build_mpirun_argv(spec)
    i = argv.index("--bind-to")
    assert argv[i:i + 5] == ("--bind-to", "core", "--map-by", "core", "--report-bindings")
    assert "-bind-to" not in argv and "-map-by" not in argv


def _options(argv: tuple[str, ...], name: str) -> list[str]:
    """The values given to option `name` on mpirun's line, in order."""
    return [argv[i + 1] for i, word in enumerate(argv) if word == name]


@pytest.mark.parametrize("mpi_args, bind, map_by", [
    # Open MPI 5 refuses an option listed twice: dtlaunch's default gives way to the user's.
    (("--bind-to", "core"), ["core"], ["slot"]),
    (("-bind-to", "core", "-report-bindings"), ["core"], ["slot"]),  # horovodrun's spelling
    (("--map-by", "core"), ["none"], ["core"]),
    (("-bind-to-core",), [], ["slot"]),  # old Open MPI spelling: sets the binding too
    (("-npernode", "1"), ["none"], []),  # sets the mapping
    (("--mca", "btl_tcp_if_include", "eth0"), ["none"], ["slot"]),  # neither: both defaults
])
def test_mpi_args_that_bind_or_map_replace_dtlaunchs_default_instead_of_repeating_it(
        mpi_args: tuple[str, ...], bind: list[str], map_by: list[str]) -> None:
    spec = JobSpec(hosts=(Host("a", 2),), num_proc=2, program=("p",), mpi_args=mpi_args,
                   mpi_version=(5, 0, 11))
    argv = build_mpirun_argv(spec)
    assert _options(argv, "--bind-to") == bind
    assert _options(argv, "--map-by") == map_by
    assert "-bind-to" not in argv and "-report-bindings" not in argv
    assert argv[-1] == "p"


def test_binding_set_in_both_mpi_args_and_binding_args_is_a_usage_error() -> None:
    spec = JobSpec(hosts=(Host("a", 2),), num_proc=2, program=("p",),
                   mpi_args=("-bind-to", "socket"), binding=("-bind-to", "core"))
    with pytest.raises(UsageError, match="both set --bind-to; give it once"):
        build_mpirun_argv(spec)
    # Different options from each are fine: --binding-args replaces the whole default.
    spec = replace(spec, mpi_args=("--map-by", "core"))
    argv = build_mpirun_argv(spec)
    assert _options(argv, "--bind-to") == ["core"] and _options(argv, "--map-by") == ["core"]
