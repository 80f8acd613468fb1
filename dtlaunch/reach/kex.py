"""Which key exchange the job's ssh links offer first.

OpenSSH 9.0 to 9.9 offer sntrup761x25519-sha512 first. Its key generation costs the client
about 0.1 s of CPU per connection (measured: 115 ms on the test bed's cores, against 2 ms for
curve25519-sha256), and mpirun opens one connection per host from the launching machine: at
64 hosts that is seconds of one core before the job can start. dtlaunch's own connections
(paramiko, the pre-flight) already use curve25519. So, for the links that the local ssh makes
for the job (dtlaunch's ssh agent for mpirun, Hydra and the Gloo host agents), dtlaunch puts
a fast exchange at the head of ssh's own list, and leaves the rest of that list as it is:

- OpenSSH 9.9: mlkem768x25519-sha256, which is post-quantum too and as fast as curve25519;
- OpenSSH 9.0 to 9.8: curve25519-sha256 (what OpenSSH offered first before 9.0);
- older or newer (10.0 offers mlkem768x25519 first): nothing, ssh's own order is fast.

Those links carry the daemons' start commands; the job's own traffic goes over the MPI's
sockets, not ssh. A user whose ssh configuration names KexAlgorithms keeps exactly that, and
`--ssh-default-kex` keeps ssh's own order.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from dtlaunch.core.version_cache import version_output

if TYPE_CHECKING:
    from dtlaunch.reach.ssh_options import SshOptions

CURVE25519 = "curve25519-sha256,curve25519-sha256@libssh.org"
MLKEM = "mlkem768x25519-sha256"
_OPENSSH = re.compile(r"OpenSSH_(\d+)\.(\d+)")
_MAX_INCLUDE_DEPTH = 16  # ssh's own limit


def openssh_version(banner: str) -> tuple[int, int] | None:
    """(major, minor) from `ssh -V`'s line, e.g. "OpenSSH_9.2p1 Debian-2+deb12u10, ..."."""
    found = _OPENSSH.search(banner)
    return (int(found.group(1)), int(found.group(2))) if found else None


def fast_kex(version: tuple[int, int] | None, configured: bool) -> str | None:
    """The exchanges to put first for this OpenSSH, or None to leave its order alone (an
    ssh that is not OpenSSH, or a configuration that chooses for itself)."""
    if version is None or configured:
        return None
    if version == (9, 9):
        return MLKEM
    if (9, 0) <= version < (9, 9):
        return CURVE25519
    return None


def config_files(config_file: str | None, home: str) -> list[tuple[str, str]]:
    """The files ssh reads, each with the folder its relative Includes start from: `-F FILE`
    alone, else the user's and the system's."""
    if config_file is not None:
        return [(config_file, os.path.join(home, ".ssh"))]
    return [(os.path.join(home, ".ssh", "config"), os.path.join(home, ".ssh")),
            ("/etc/ssh/ssh_config", "/etc/ssh")]


def names_kex(files: Sequence[tuple[str, str]]) -> bool:
    """Whether any of these ssh configuration files (and what they Include) sets
    KexAlgorithms, in any Host or Match block: then the user chose, and dtlaunch does not."""
    return any(word == "kexalgorithms" for word in _keywords(files, 0))


def _keywords(files: Sequence[tuple[str, str]], depth: int) -> Iterator[str]:
    if depth > _MAX_INCLUDE_DEPTH:
        return
    for path, base in files:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                text = handle.read(1 << 20)
        except OSError:  # absent or unreadable: ssh reads nothing from it either
            continue
        for line in text.splitlines():
            words = line.replace("=", " ", 1).split()
            if not words or words[0].startswith("#"):
                continue
            keyword = words[0].lower()
            yield keyword
            if keyword == "include":
                included = []
                for pattern in words[1:]:
                    pattern = os.path.expanduser(pattern)
                    full = pattern if os.path.isabs(pattern) else os.path.join(base, pattern)
                    included += [(p, base) for p in sorted(glob.glob(full))]
                yield from _keywords(included, depth + 1)


def for_local_ssh(options: SshOptions, environ: Mapping[str, str]) -> SshOptions:
    """`options` with the key exchange chosen for this machine's ssh (the one on the job's
    PATH, which dtlaunch's ssh agent runs). Asks `ssh -V` (once per build of ssh, see
    core.version_cache); any trouble asking
    leaves ssh's own order."""
    if options.default_kex:
        return options
    ssh = shutil.which("ssh", path=environ.get("PATH", os.defpath))
    if ssh is None:
        return options
    try:
        _, banner = version_output([ssh, "-V"], timeout=10, environ=environ)
    except (OSError, subprocess.TimeoutExpired):
        return options
    try:  # ssh reads ~/.ssh from the password database's home, not $HOME
        home = pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        home = os.path.expanduser("~")
    configured = names_kex(config_files(options.config_file, home))
    return replace(options, kex_first=fast_kex(openssh_version(banner), configured))
