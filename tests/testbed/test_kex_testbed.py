"""The key exchange of the job's ssh links, as the host's sshd saw it (reach.kex)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.suite import dtlaunch_argv
from helpers.testbed import TestBed

from dtlaunch.reach.kex import openssh_version

pytestmark = pytest.mark.testbed


def _local_openssh() -> tuple[int, int] | None:
    out = subprocess.run(["ssh", "-V"], capture_output=True, text=True, timeout=10)
    return openssh_version(out.stderr + out.stdout)


def _kex_seen(log: Path) -> list[str]:
    """The exchange of each connection h2's sshd logged ("kex: algorithm: NAME")."""
    return [line.split("kex: algorithm: ", 1)[1].split()[0]
            for line in log.read_text(errors="replace").splitlines()
            if "kex: algorithm: " in line]


@pytest.mark.parametrize(("flags", "expected"), [
    ((), "curve25519-sha256"),
    (("--ssh-default-kex",), "sntrup761x25519-sha512"),
], ids=["fast-exchange-first", "ssh-default-kex"])
def test_the_jobs_ssh_links_use_the_exchange_dtlaunch_chose(
        make_bed: Callable[..., TestBed], flags: tuple[str, ...], expected: str) -> None:
    version = _local_openssh()
    if version is None or not (9, 0) <= version < (9, 9):
        pytest.fail(f"this test is written for OpenSSH 9.0-9.8 (sntrup761x25519 first), not {version}")
    bed = make_bed(2, sshd_extra={"h2": ["LogLevel DEBUG1"]})
    log = bed.host("h2").dir / "sshd.log"
    before = len(_kex_seen(log))
    argv = dtlaunch_argv("run", "--no-check", *flags, "-H", "h2:1", "--iface", bed.subnet,
                         "--ssh-config", str(bed.ssh_config), "/bin/hostname")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "h2" in proc.stdout
    seen = _kex_seen(log)[before:]
    assert seen, "h2's sshd logged no key exchange"
    # Every link the job made (mpirun's daemon start) used the exchange chosen.
    assert set(seen) == {expected}, seen


def test_tree_spawn_gives_every_hosts_ssh_the_portable_list(make_bed: Callable[..., TestBed]) -> None:
    """--tree-spawn: the daemons are started by every host's own ssh (plm_rsh_args); each
    login, from the launcher or from another host, used curve25519-sha256."""
    version = _local_openssh()
    if version is None or not (9, 0) <= version < (9, 9):
        pytest.fail(f"this test is written for OpenSSH 9.0-9.8 (sntrup761x25519 first), not {version}")
    debug = ["LogLevel DEBUG1"]
    bed = make_bed(3, sshd_extra={"h2": debug, "h3": debug})
    logs = [bed.host(h).dir / "sshd.log" for h in ("h2", "h3")]
    before = [len(_kex_seen(log)) for log in logs]
    argv = dtlaunch_argv("run", "--no-check", "--tree-spawn", "-H", "h2:1,h3:1", "--iface",
                         bed.subnet, "--ssh-config", str(bed.ssh_config), "/bin/hostname")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = [kex for log, n in zip(logs, before) for kex in _kex_seen(log)[n:]]
    assert len(seen) >= 2, seen  # a login on each host
    assert set(seen) == {"curve25519-sha256"}, seen
