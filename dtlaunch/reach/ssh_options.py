"""How dtlaunch's own SSH and the MPI launcher's ssh reach the hosts."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

from dtlaunch.core.errors import UsageError

# ssh settings that accept any host key: StrictHostKeyChecking=no/off, or a known_hosts of
# /dev/null (with accept-new, every host is new every time).
_ANY_HOST_KEY = re.compile(
    r"StrictHostKeyChecking\W{0,3}(?:no|off)\b|UserKnownHostsFile\W{0,3}/dev/null", re.IGNORECASE)


def refuse_any_host_key(where: str, text: str) -> None:
    """Refuse ssh settings in `text` (found in `where`) that accept any host key, with or
    without --no-check: dtlaunch never logs in to a host whose key it cannot verify."""
    match = _ANY_HOST_KEY.search(text)
    if match:
        raise UsageError(f"{where} sets {match.group(0)!r}, which lets ssh log in to hosts "
                         "whose key is unknown or changed; dtlaunch refuses that (use "
                         "--accept-new-host-keys to trust hosts on first contact)")


# For ssh on the hosts (tree spawn), whose version is not known here: what OpenSSH 7.4 to 8.9
# offered, in its order; every name is known to any OpenSSH since 7.4 (an unknown one would
# make ssh refuse the whole option), and servers since 6.5 share the first.
PORTABLE = ("curve25519-sha256,curve25519-sha256@libssh.org,ecdh-sha2-nistp256,"
            "ecdh-sha2-nistp384,ecdh-sha2-nistp521,diffie-hellman-group-exchange-sha256,"
            "diffie-hellman-group16-sha512,diffie-hellman-group18-sha512,"
            "diffie-hellman-group14-sha256")


@dataclass(frozen=True)
class SshOptions:
    port: int | None = None
    identity_file: str | None = None
    config_file: str | None = None
    connect_timeout: int = 10
    # "yes": unknown keys fail; "accept-new": trust on first use (opt-in). Never "no".
    host_key_policy: str = "yes"
    default_kex: bool = False  # --ssh-default-kex: leave ssh's key exchange order alone
    # The key exchanges the local ssh offers first for the job's links (reach.kex), decided
    # where the job is prepared; None: ssh's own order.
    kex_first: str | None = None

    def launcher_ssh_args(self) -> tuple[str, ...]:
        """ssh_args for the links this machine's ssh makes for the job (dtlaunch's ssh agent),
        with the key exchange chosen for that ssh. Never for an ssh on other hosts (tree spawn:
        tree_ssh_args; doctor's host-to-host checks): their version is not known here."""
        # `^`: at the head of ssh's own list, the rest of it kept (see reach.kex).
        kex = ("-o", f"KexAlgorithms=^{self.kex_first}") if self.kex_first is not None else ()
        return self.ssh_args() + kex

    def tree_ssh_args(self) -> tuple[str, ...]:
        """ssh_args for `--tree-spawn`, where every host's own ssh runs them: when a fast
        exchange was chosen here, the list OpenSSH offered before 9.0 (PORTABLE:
        every name in it is known to OpenSSH since 7.4, so no host's ssh refuses the option),
        written out whole, since `^` would reach a remote shell."""
        return self.ssh_args() + (("-o", f"KexAlgorithms={PORTABLE}") if self.kex_first is not None else ())

    def ssh_args(self) -> tuple[str, ...]:
        """Options for OpenSSH as the MPI launcher will call it: never prompt, never hang."""
        args: list[str] = [
            "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={self.connect_timeout}",
            "-o", f"StrictHostKeyChecking={self.host_key_policy}",
            # A dead host during a job ends the ssh link, so the launcher notices and aborts.
            "-o", "ServerAliveInterval=5",
            "-o", "ServerAliveCountMax=3",
        ]  # fmt: skip
        if self.port is not None:
            args += ["-p", str(self.port)]
        if self.identity_file:
            args += ["-i", self.identity_file]
        if self.config_file:
            args += ["-F", self.config_file]
        return tuple(args)


def _check_file(value: str, option: str, devnull_ok: bool) -> None:
    """A regular file (or, where ssh takes it to mean "none", /dev/null); anything else is
    named for what it is."""
    from dtlaunch.core.textfile import file_kind

    try:
        mode = os.stat(value).st_mode
    except FileNotFoundError:
        raise UsageError(f"{option}: no such file: {value}") from None
    except OSError as exc:
        raise UsageError(f"{option}: cannot read {value}: {exc.strerror or exc}") from None
    if stat.S_ISREG(mode):
        return
    if devnull_ok and stat.S_ISCHR(mode) and os.path.realpath(value) == os.devnull:
        return
    raise UsageError(f"{option}: {value} is {file_kind(mode)}")


def ssh_options_from(port: int | None, identity: str | None, config: str | None,
                     timeout: int, accept_new: bool, default_kex: bool = False) -> SshOptions:
    """The command line's SSH options, checked: the files exist and are files.
    `--ssh-config /dev/null` is ssh's own way to read no config file (`ssh -F /dev/null`)."""
    if identity is not None:
        _check_file(identity, "--ssh-identity-file", devnull_ok=False)
    if config is not None:
        _check_file(config, "--ssh-config", devnull_ok=True)
    return SshOptions(port=port, identity_file=identity, config_file=config, connect_timeout=timeout,
                      host_key_policy="accept-new" if accept_new else "yes", default_kex=default_kex)


# What may pass through mpirun's ssh options (plm_rsh_args): Open MPI splits them on
# whitespace and copies them, inside double quotes, onto each daemon's command line, where a
# remote shell expands `$`, backquotes, `"` and `\`.
_RSH_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./~-]+")


def rsh_safe(value: str) -> bool:
    return bool(_RSH_SAFE.fullmatch(value))


def check_rsh_arg(value: str, option: str) -> str:
    """A path for plm_rsh_args (tree spawn, or no ssh wrapper): plain characters only."""
    if not rsh_safe(value):
        bad = sorted({c for c in value if not _RSH_SAFE.fullmatch(c)})
        raise UsageError(f"{option}: {value!r} contains {' '.join(map(repr, bad))}, which "
                         "mpirun's ssh options (--tree-spawn) cannot carry safely; "
                         "rename the file or link it from a plain path")
    return value
