"""The options run and doctor share (which hosts, how to reach them), and `-H` and `--hostfile`
read into Host values: the hostfile's one reader (dtlaunch.core.textfile), its text parsed by
dtlaunch.job.hosts."""

from __future__ import annotations

from dataclasses import dataclass

from dtlaunch.core.errors import UsageError
from dtlaunch.core.textfile import read_small_text
from dtlaunch.job.hosts import Host, parse_hostfile_text, parse_hosts
from dtlaunch.reach.ssh_options import SshOptions, ssh_options_from

# Hostfiles larger than this are not hostfiles (a wrong path to a dataset, say).
MAX_HOSTFILE_BYTES = 1 << 20


@dataclass(frozen=True)
class HostArgs:
    """The options run and doctor share (console.options.host_options), as given."""

    hosts: str | None = None  # -H
    hostfile: str | None = None
    iface: str | None = None
    python: str | None = None  # None: the interpreter running dtlaunch
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    ssh_config: str | None = None
    connect_timeout: int = 10
    accept_new_host_keys: bool = False
    via: str = "auto"  # --launcher: how the hosts are reached (auto, ssh, slurm)

    def read_hosts(self) -> tuple[Host, ...]:
        """`--hosts` or `--hostfile` (not both; every failure a one-line UsageError); neither:
        no hosts (this machine)."""
        if self.hosts is not None and self.hostfile is not None:
            raise UsageError("give either --hosts or --hostfile, not both")
        if self.hostfile is not None:
            text = read_small_text(self.hostfile, "--hostfile", MAX_HOSTFILE_BYTES, "a hostfile")
            return parse_hostfile_text(text, self.hostfile)
        if self.hosts is not None:
            return parse_hosts(self.hosts)
        return ()

    def ssh_options(self, default_kex: bool = False) -> SshOptions:
        return ssh_options_from(self.ssh_port, self.ssh_identity_file, self.ssh_config,
                                self.connect_timeout, self.accept_new_host_keys, default_kex)
