"""How dtlaunch's own SSH and the MPI launcher's ssh reach the hosts."""

from __future__ import annotations

import os
from dataclasses import dataclass

from dtlaunch.errors import UsageError


@dataclass(frozen=True)
class SshOptions:
    port: int | None = None
    identity_file: str | None = None
    config_file: str | None = None
    connect_timeout: int = 10
    # "yes": unknown keys fail; "accept-new": trust on first use (opt-in). Never "no".
    host_key_policy: str = "yes"

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


def ssh_options_from(port: int | None, identity: str | None, config: str | None,
                     timeout: int, accept_new: bool) -> SshOptions:
    """The command line's SSH options, checked: the files exist and can pass to the launcher."""
    for value, option in ((identity, "--ssh-identity-file"), (config, "--ssh-config")):
        if value is not None:
            check_rsh_arg(value, option)
            if not os.path.isfile(value):
                raise UsageError(f"{option}: no such file: {value}")
    return SshOptions(port=port, identity_file=identity, config_file=config,
                      connect_timeout=timeout,
                      host_key_policy="accept-new" if accept_new else "yes")


def check_rsh_arg(value: str, option: str) -> str:
    """MPI launchers split their ssh options on whitespace, so a path with a space cannot pass."""
    if any(c.isspace() for c in value):
        raise UsageError(f"{option}: {value!r} contains whitespace, which mpirun's ssh options cannot carry")
    return value
