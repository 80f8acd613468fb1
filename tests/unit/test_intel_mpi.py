"""What Intel MPI's Hydra needs beyond MPICH's: rank placement, its ssh arguments, its failure
banner and launch errors. Pure code; the real thing runs in tests/testbed/test_hydra_testbed.py and
tests/testbed/test_intel_mpi_testbed.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.mpis import INTEL, fake_mpi, spec

from dtlaunch.agents import rsh
from dtlaunch.core.errors import UsageError
from dtlaunch.hydra.family import Hydra, agent_script, build_mpiexec_argv, ranks_per_host
from dtlaunch.hydra.output import analyze_hydra
from dtlaunch.job.binding import intel_pinning
from dtlaunch.job.env import EnvPlan, EnvVar
from dtlaunch.job.hosts import Host
from dtlaunch.mpijob import launcher_choice
from dtlaunch.reach.ssh_options import SshOptions
from dtlaunch.run.execute import write_private_executable

INTEL_MPI = Hydra("/cache/bin", "/venv/bin/python", "/pkg/dtlaunch/agents/rsh.py", "Intel MPI")
PROGRAM = ("/venv/bin/python", "train.py", "--lr", "1")


def placement(argv: tuple[str, ...]) -> tuple[str, ...]:
    """The argv less the options every Hydra job has (launcher, interface, variables)."""
    start = max(i for i, a in enumerate(argv) if a == "-genv") + 3  # after -genv NAME VALUE
    return argv[1:argv.index("-launcher")] + argv[start:]


def test_intel_mpi_is_picked_from_its_banner(tmp_path: Path) -> None:
    fake_mpi(tmp_path / "intel", INTEL)
    family, program, _ = launcher_choice.launcher_family({"PATH": str(tmp_path / "intel")})
    assert isinstance(family, Hydra) and family.name == "Intel MPI"
    assert program == str(tmp_path / "intel" / "mpiexec")


def test_same_slots_everywhere_become_ppn() -> None:
    """Intel's Hydra ignores `-hosts h1:2`: it would put as many ranks on h1 as it has cores."""
    argv = INTEL_MPI.build_argv(spec(), "mpiexec")
    assert placement(argv) == ("-n", "4", "-hosts", "h1,h2", "-ppn", "2", *PROGRAM)
    # Fewer ranks than slots: only the hosts that get ranks, as many as mpirun would put there.
    argv = INTEL_MPI.build_argv(spec(hosts=(Host("h1", 2), Host("h2", 2), Host("h3", 2)),
                                     num_proc=4), "mpiexec")
    assert placement(argv) == ("-n", "4", "-hosts", "h1,h2", "-ppn", "2", *PROGRAM)


def test_different_slots_become_one_argument_set_per_host() -> None:
    argv = INTEL_MPI.build_argv(spec(hosts=(Host("h1", 1), Host("h2", 2)), num_proc=3,
                                     mpi_args=("-print-rank-map",)), "mpiexec")
    assert placement(argv) == ("-print-rank-map", "-n", "1", "-host", "h1", *PROGRAM, ":",
                               "-n", "2", "-host", "h2", *PROGRAM)
    # The same spec for MPICH keeps `-hosts h1:1,h2:2`.
    mpich = build_mpiexec_argv(spec(hosts=(Host("h1", 1), Host("h2", 2)), num_proc=3))
    assert mpich[1:5] == ("-n", "3", "-hosts", "h1:1,h2:2")


def test_iface_pins_libfabrics_tcp_provider_too() -> None:
    """Measured on the bed with a docker0 bridge on every host: without FI_TCP_IFACE Intel MPI's
    ranks talk over docker0 and wait for ever."""
    argv = INTEL_MPI.build_argv(spec(), "mpiexec")
    assert any(argv[i:i + 3] == ("-genv", "FI_TCP_IFACE", "eth0") for i in range(len(argv)))
    assert "FI_TCP_IFACE" not in INTEL_MPI.build_argv(spec(iface=None), "mpiexec")
    # The job's own FI_TCP_IFACE (-x) wins: it goes by name, dtlaunch adds none.
    mine = spec(env=EnvPlan((EnvVar("FI_TCP_IFACE", "ib0"),)))
    argv = INTEL_MPI.build_argv(mine, "mpiexec")
    assert argv.count("FI_TCP_IFACE") == 1 and argv[argv.index("-genvlist") + 1] == "FI_TCP_IFACE"


def test_ranks_fill_hosts_in_slot_order_and_wrap_when_oversubscribed() -> None:
    hosts = (Host("a", 2), Host("b", 1), Host("c", 3))
    assert ranks_per_host(hosts, 1) == [("a", 1)]
    assert ranks_per_host(hosts, 4) == [("a", 2), ("b", 1), ("c", 1)]
    assert ranks_per_host(hosts, 6) == [("a", 2), ("b", 1), ("c", 3)]
    assert ranks_per_host(hosts, 9) == [("a", 4), ("b", 2), ("c", 3)]
    assert ranks_per_host((Host("a", 2), Host("b", 2)), 8) == [("a", 4), ("b", 4)]


def test_quiet_is_dropped_before_the_host_only() -> None:
    assert rsh.without_quiet(["-q", "-x", "h2", "/bin/proxy", "-q"]) == \
        (["-x", "h2", "/bin/proxy", "-q"], "h2")
    assert rsh.without_quiet(["-o", "BatchMode=yes", "-l", "-q", "h2", "true"]) == \
        (["-o", "BatchMode=yes", "-l", "-q", "h2", "true"], "h2")  # -l's value is a user named -q
    assert rsh.without_quiet(["h2", "-q"]) == (["h2", "-q"], "h2")
    assert rsh.without_quiet(["-p", "22", "-q"]) == (["-p", "22"], "?")


def test_agent_runs_ssh_without_intels_quiet(tmp_path: Path) -> None:
    """The real agent file run as Intel's Hydra runs it (`-q -x HOST PROXY...`): ssh gets no
    -q, so its own error lines and the log that tells a lost link still come."""
    fake = tmp_path / "bin" / "ssh"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\necho "ssh: Could not resolve '
                    'hostname h9: Name or service not known" >&2\nexit 255\n')
    fake.chmod(0o755)
    agent = tmp_path / "cache" / "hydra-ssh-x"
    write_private_executable(str(agent), agent_script(os.path.realpath(sys.executable),
                                                 rsh.__file__ or "", SshOptions().ssh_args()))
    out = subprocess.run([str(agent), "-q", "-x", "h9", "/venv/bin/hydra_bstrap_proxy", "-q"],
                         capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{fake.parent}:/usr/bin:/bin"})
    words = out.stdout.split("\n")[:-1]
    assert words[-4:] == ["-x", "h9", "/venv/bin/hydra_bstrap_proxy", "-q"]
    assert "-q" not in words[:-1]
    assert out.stderr.startswith("ssh: Could not resolve hostname h9")


BANNER = """
===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   RANK 1 PID 32393 RUNNING AT h2
=   KILLED BY SIGNAL: 9 (Killed)
===================================================================================
""".splitlines()


def test_intels_banner_names_the_rank_host_and_signal() -> None:
    failure = analyze_hydra(BANNER, ["h1", "h2", "h2"])
    assert failure is not None and failure.describe() == "rank 1 on host h2 was killed by signal 9 (SIGKILL)"


@pytest.mark.parametrize("ssh_line", ["ssh: Could not resolve hostname h9: Name or service not known",
                                      "Host key verification failed."])
def test_a_proxy_intel_could_not_start_is_named_with_sshs_reason(ssh_line: str) -> None:
    lines = [ssh_line,
             "[mpiexec@h1] Error: Unable to run bstrap_proxy on h9 (pid 928, exit code 65280)",
             "[mpiexec@h1] Error setting up the bootstrap proxies"]
    failure = analyze_hydra(lines, ["h1", "h9"])
    assert failure is not None
    assert failure.describe().startswith(f"mpiexec could not start its proxy on every host ({ssh_line})")


# --- --binding-args: Intel's Hydra takes -bind-to and ignores it ------------------------------


@pytest.mark.parametrize("words, pinning", [
    (("-bind-to", "none"), (("I_MPI_PIN", "0"),)),
    (("-bind-to", "core"), (("I_MPI_PIN_DOMAIN", "core"),)),
    (("--bind-to", "socket:overload-allowed"), (("I_MPI_PIN_DOMAIN", "socket"),)),
    (("-bind-to-core",), (("I_MPI_PIN_DOMAIN", "core"),)),
    (("-bind-to", "l3cache"), (("I_MPI_PIN_DOMAIN", "cache3"),)),
])
def test_bind_to_becomes_intels_pin_variables(words: tuple[str, ...],
                                              pinning: tuple[tuple[str, str], ...]) -> None:
    assert intel_pinning(words) == pinning
    argv = build_mpiexec_argv(spec(binding=words), intel=True)
    assert not any(a.lstrip("-").startswith("bind-to") for a in argv)
    name, value = pinning[0]
    i = argv.index(name)
    assert argv[i - 1:i + 2] == ("-genv", name, value)
    # MPICH's Hydra honours -bind-to: it goes there unchanged.
    assert build_mpiexec_argv(spec(binding=words)).count(words[0]) == 1


@pytest.mark.parametrize("words", [("-map-by", "core"), ("-report-bindings",),
                                   ("-bind-to", "cpu-list")])
def test_what_intel_cannot_be_told_that_way_is_a_usage_error(words: tuple[str, ...]) -> None:
    with pytest.raises(UsageError, match="--binding-args"):
        build_mpiexec_argv(spec(binding=words), intel=True)


def test_bind_to_in_mpi_args_is_refused_under_intel_mpi() -> None:
    with pytest.raises(UsageError, match="ignores it"):
        build_mpiexec_argv(spec(mpi_args=("-bind-to", "none")), intel=True)
