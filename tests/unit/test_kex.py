"""reach.kex: which key exchange the job's ssh links offer first."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from dtlaunch.reach.kex import (
    CURVE25519,
    MLKEM,
    config_files,
    fast_kex,
    for_local_ssh,
    names_kex,
    openssh_version,
)
from dtlaunch.reach.ssh_options import PORTABLE, SshOptions


@pytest.mark.parametrize(("banner", "version"), [
    ("OpenSSH_9.2p1 Debian-2+deb12u10, OpenSSL 3.0.19 27 Jan 2026", (9, 2)),
    ("OpenSSH_8.9p1 Ubuntu-3ubuntu0.10, OpenSSL 3.0.2 15 Mar 2022", (8, 9)),
    ("OpenSSH_10.0p2, OpenSSL 3.5.0", (10, 0)),
    ("Dropbear v2022.83", None),
    ("", None),
])
def test_openssh_version_reads_ssh_dash_v(banner: str, version: tuple[int, int] | None) -> None:
    assert openssh_version(banner) == version


@pytest.mark.parametrize(("version", "configured", "first"), [
    ((9, 0), False, CURVE25519),  # sntrup761x25519 became the default here
    ((9, 2), False, CURVE25519),
    ((9, 8), False, CURVE25519),
    ((9, 9), False, MLKEM),  # post-quantum and fast: kept post-quantum
    ((10, 0), False, None),  # mlkem768x25519 is already first
    ((8, 9), False, None),  # curve25519 is already first
    ((9, 2), True, None),  # the user's configuration chose
    (None, False, None),  # not OpenSSH
])
def test_a_fast_exchange_goes_first_only_where_ssh_would_pick_a_slow_one(
        version: tuple[int, int] | None, configured: bool, first: str | None) -> None:
    assert fast_kex(version, configured) == first


def test_only_the_local_links_carry_the_choice() -> None:
    options = SshOptions(kex_first=CURVE25519)
    assert options.launcher_ssh_args()[-2:] == ("-o", f"KexAlgorithms=^{CURVE25519}")
    # Host-to-host ssh (tree spawn, doctor's peer checks) runs an ssh of unknown version.
    assert not any("KexAlgorithms" in a for a in options.ssh_args())
    assert SshOptions().launcher_ssh_args() == SshOptions().ssh_args()


def test_a_kexalgorithms_line_anywhere_in_the_config_is_the_users_choice(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh" / "conf.d").mkdir(parents=True)
    config = home / ".ssh" / "config"
    config.write_text("Host *\n  User me\n")
    files = [(str(config), str(home / ".ssh"))]
    assert not names_kex(files)
    config.write_text("Host gpu*\n  kexalgorithms=curve25519-sha256\n")
    assert names_kex(files)
    # Through an Include, relative to ~/.ssh, with a glob.
    config.write_text("Include conf.d/*.conf\nHost *\n  User me\n")
    (home / ".ssh" / "conf.d" / "a.conf").write_text("# KexAlgorithms in a comment\n")
    assert not names_kex(files)
    (home / ".ssh" / "conf.d" / "b.conf").write_text("Match all\n KexAlgorithms -sntrup*\n")
    assert names_kex(files)
    # An Include of itself ends at ssh's depth limit, not in a loop.
    config.write_text(f"Include {config}\n")
    assert not names_kex(files)


def test_the_files_read_are_ssh_s_own(tmp_path: Path) -> None:
    assert config_files(None, "/home/u") == [("/home/u/.ssh/config", "/home/u/.ssh"),
                                             ("/etc/ssh/ssh_config", "/etc/ssh")]
    assert config_files("/c/cfg", "/home/u") == [("/c/cfg", "/home/u/.ssh")]  # -F alone


def _local_version() -> tuple[int, int] | None:
    out = subprocess.run(["ssh", "-V"], capture_output=True, text=True, timeout=10)
    return openssh_version(out.stderr)


def test_the_machines_ssh_decides(tmp_path: Path) -> None:
    """This machine's own ssh, asked: its version picks the exchange; --ssh-default-kex and a
    configuration naming KexAlgorithms leave ssh alone; no ssh on PATH changes nothing."""
    env = dict(os.environ)
    config = tmp_path / "cfg"
    config.write_text("Host *\n  User me\n")
    chosen = for_local_ssh(SshOptions(config_file=str(config)), env)
    assert chosen.kex_first == fast_kex(_local_version(), False)
    assert for_local_ssh(SshOptions(config_file=str(config), default_kex=True), env).kex_first is None
    config.write_text("KexAlgorithms sntrup761x25519-sha512@openssh.com\n")
    assert for_local_ssh(SshOptions(config_file=str(config)), env).kex_first is None
    assert for_local_ssh(SshOptions(), {**env, "PATH": str(tmp_path)}).kex_first is None


def test_the_choice_reaches_the_agent_and_not_the_tree(tmp_path: Path) -> None:
    """Planned for this machine's ssh agent (DTLAUNCH_SSH_ARGS); never onto plm_rsh_args,
    which tree spawn hands to the hosts' own ssh."""
    from dtlaunch.job.command import EXECUTABLE, Program
    from dtlaunch.job.hosts import parse_hosts
    from dtlaunch.openmpi.family import OPEN_MPI
    from dtlaunch.plan.plan import RunRequest, plan_run

    ssh = SshOptions(kex_first=CURVE25519)
    request = RunRequest(hosts=parse_hosts("h1:1,h2:1"), program=Program(("/bin/true",), EXECUTABLE), ssh=ssh, python="/usr/bin/python3",
                         rsh_agent="/x/python -I -S /x/rsh.py")
    plan = plan_run(request, {"PATH": "/usr/bin"}, family=OPEN_MPI, mpi_version=(4, 1, 4))
    args = json.loads(plan.launcher_env["DTLAUNCH_SSH_ARGS"])
    assert args[-2:] == ["-o", f"KexAlgorithms=^{CURVE25519}"]
    tree = plan_run(replace(request, tree_spawn=True), {"PATH": "/usr/bin"}, family=OPEN_MPI,
                    mpi_version=(4, 1, 4))
    assert "DTLAUNCH_SSH_ARGS" not in tree.launcher_env
    # Tree spawn: the hosts' own ssh runs plm_rsh_args, through a remote shell: the portable
    # list written out (no `^`), every name known to OpenSSH since 7.4.
    rsh_args = tree.argv[tree.argv.index("plm_rsh_args") + 1]
    assert rsh_args.endswith(f"-o KexAlgorithms={PORTABLE}") and "^" not in rsh_args
    assert PORTABLE.startswith(CURVE25519) and "sntrup" not in PORTABLE and "mlkem" not in PORTABLE
    plain = plan_run(replace(request, tree_spawn=True, ssh=SshOptions()), {"PATH": "/usr/bin"},
                     family=OPEN_MPI, mpi_version=(4, 1, 4))
    assert not any("KexAlgorithms" in a for a in plain.argv)
