"""What each host's agent is started with, for dtlaunch.agents.gloo_start (Gloo, elastic and
torch.distributed jobs): each host's argv and the bytes its agent reads, which go to it on
standard input, never on a command line.

Each host reaches the store at the address this machine uses towards that host (the source
address of its route), found without sending anything; a host named as this machine
(localhost) is run here, without ssh, and reaches the store on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from dtlaunch import agents
from dtlaunch.core.errors import DtlaunchError
from dtlaunch.job.hosts import local_names
from dtlaunch.reach.ssh_options import SshOptions


def is_local(host: str) -> bool:
    """This machine, by any of its names (as the prober takes them): its agent runs here,
    without ssh to itself."""
    return host in local_names()


def host_addresses(host: str, ssh: SshOptions, known: str | None, option: str, purpose: str,
                   ) -> tuple[str, list[tuple[Any, ...]]]:
    """The name `host` is reached by (after ssh config's HostName) and its addresses as
    getaddrinfo gives them, IPv4 first (at `known` instead: its address as the scheduler lists
    it). A name that does not resolve: "OPTION: cannot resolve host HOST (NAME)PURPOSE: why"."""
    from dtlaunch.reach.ssh_config import load_ssh_config, resolve_target

    target = resolve_target(host, ssh, load_ssh_config(ssh.config_file))
    try:
        infos = socket.getaddrinfo(known or target.hostname, 9, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError) as exc:
        raise DtlaunchError(f"{option}: cannot resolve host {host} ({target.hostname})"
                            f"{purpose}: {exc}") from None
    return target.hostname, sorted(infos, key=lambda i: i[0] != socket.AF_INET)


def store_address(host: str, ssh: SshOptions, known: str | None = None) -> str:
    """Where `host`'s agent reaches the store: 127.0.0.1 for this machine, else the address
    this machine sends from towards `host` (after ssh config's HostName, or at `known`, its
    address as the scheduler lists it)."""
    if is_local(host):
        return "127.0.0.1"
    name, infos = host_addresses(host, ssh, known, "--gloo", " to find the address its ranks "
                                 "reach dtlaunch's rendezvous at")
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.connect(addr)  # UDP: picks the route, sends nothing
            except OSError:
                continue
            return str(probe.getsockname()[0])
    raise DtlaunchError(f"--gloo: no route to host {host} ({name}) for the rendezvous")


# What an agent started by srun keeps of dtlaunch's environment (with Slurm's own SLURM_*):
# srun passes all of it by default, and the agent hands its environment to the ranks, which
# must get only the allow-list's variables (sent on standard input) and a login's basics.
SRUN_EXPORT = ("HOME", "USER", "LOGNAME", "PATH", "LANG", "TERM")
# The task identity srun gives the agent's one-task step: every rank would inherit "task 0 of
# 1", which scripts that read Slurm's variables (SLURM_PROCID for the rank) would believe.
SRUN_TASK_VARIABLES = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS",
                       "SLURM_NPROCS", "SLURM_GTIDS", "SLURM_TASK_PID", "SLURM_STEP_NUM_TASKS",
                       "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
                       "SLURM_STEP_NUM_NODES", "SLURM_STEP_NODELIST", "SLURM_NTASKS_PER_NODE")


def srun_argv(host: str, boot: Sequence[str]) -> list[str]:
    """A one-task step on `host` running the agent's bootstrap; its standard input is the
    agent's, as ssh's would be. srun passes argv as it is: no remote shell, no quoting."""
    return ["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={host}",
            "--kill-on-bad-exit=1", "--quiet", "--input=all",
            "--export=" + ",".join(SRUN_EXPORT), *boot]


def agent_job(host: str, env: Mapping[str, str], shim_argv: Sequence[str], via_srun: bool,
              **own: object) -> dict[str, object]:
    """What one host's agent reads after its code: the variables every rank there gets, the
    rank shim's argv, where it runs; and the kind's own (`own`: where its store is, its
    ranks...)."""
    return {
        "host": host,
        "env": dict(env),
        "ranks": [],
        "shim": list(shim_argv),
        "cwd": os.getcwd(),
        "sweep": not is_local(host),
        "unset": list(SRUN_TASK_VARIABLES) if via_srun else [],
        **own,
    }


def host_entry(host: str, job: Mapping[str, object], python: str, via_srun: bool,
               agent: str = "gloo_host.py") -> dict[str, str | list[str]]:
    """The fan-out's line for one host: how to reach it and the bytes its agent reads."""
    boot, code = agents.ship(agent).stdin(python)
    payload = code + json.dumps(job).encode("utf-8") + b"\n"
    if is_local(host):
        argv = boot
    elif via_srun:
        argv = srun_argv(host, boot)
    else:
        # ssh hands its command to the remote shell as one line: every word quoted.
        argv = [*agents.ship("rsh.py").here(), host, *map(shlex.quote, boot)]
    return {"name": host, "argv": argv, "input": payload.decode("utf-8")}
