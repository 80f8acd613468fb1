"""What starts a Gloo job: the rendezvous store, bound to the job's addresses, and the job for
dtlaunch.agents.gloo_start (each host's argv and the bytes its agent reads), which goes to it
on standard input, never on a command line.

Each host reaches the store at the address this machine uses towards that host (the source
address of its route), found without sending anything; a host named as this machine
(localhost) is run here, without ssh, and reaches the store on 127.0.0.1.
"""

from __future__ import annotations

import binascii
import json
import os
import shlex
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dtlaunch import agents
from dtlaunch.core.errors import DtlaunchError
from dtlaunch.gloo.ranks import place_ranks, scope_sizes
from dtlaunch.gloo.rendezvous import Store, new_secret
from dtlaunch.job.hosts import local_names
from dtlaunch.reach.ssh_options import SshOptions


@dataclass(frozen=True)
class GlooJob:
    """The fan-out's argv, its environment, and what it reads on standard input."""

    argv: tuple[str, ...]
    env: dict[str, str]
    stdin: bytes
    store: Store


def is_local(host: str) -> bool:
    """This machine, by any of its names (as the prober takes them): its agent runs here,
    without ssh to itself."""
    return host in local_names()


def source_address(host: str, ssh: SshOptions, known: str | None = None) -> str:
    """The address this machine sends from towards `host` (after ssh config's HostName, or at
    `known`, its address as the scheduler lists it)."""
    from dtlaunch.reach.ssh_config import load_ssh_config, resolve_target

    target = resolve_target(host, ssh, load_ssh_config(ssh.config_file))
    try:
        infos = socket.getaddrinfo(known or target.hostname, 9, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError) as exc:
        raise DtlaunchError(f"--gloo: cannot resolve host {host} ({target.hostname}) to find "
                            f"the address its ranks reach dtlaunch's rendezvous at: {exc}") from None
    for family, kind, proto, _, addr in sorted(infos, key=lambda i: i[0] != socket.AF_INET):
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.connect(addr)  # UDP: picks the route, sends nothing
            except OSError:
                continue
            return str(probe.getsockname()[0])
    raise DtlaunchError(f"--gloo: no route to host {host} ({target.hostname}) for the "
                        "rendezvous")


def remote_words(argv: Sequence[str]) -> list[str]:
    """ssh hands its command to the remote shell as one line: every word quoted."""
    return [shlex.quote(word) for word in argv]


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


def agent_job(host: str, store_host: str, port: int, secret: bytes, env: Mapping[str, str],
              shim_argv: Sequence[str], iface_cidrs: Sequence[str], via_srun: bool,
              ) -> dict[str, object]:
    """What one host's agent reads after its code: where the store is, the job's secret, the
    variables every rank there gets, the rank shim's argv (its ranks are added by the caller)."""
    return {
        "host": host,
        "store": {"host": store_host, "port": port,
                  "secret": binascii.hexlify(secret).decode("ascii")},
        "env": dict(env),
        "ranks": [],
        "shim": list(shim_argv),
        "cwd": os.getcwd(),
        "sweep": not is_local(host),
        "iface_cidrs": list(iface_cidrs),
        "unset": list(SRUN_TASK_VARIABLES) if via_srun else [],
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
        argv = [*agents.ship("rsh.py").here(), host, *remote_words(boot)]
    return {"name": host, "argv": argv, "input": payload.decode("utf-8")}


def store_address(host: str, ssh: SshOptions, known: str | None = None) -> str:
    """Where `host`'s agent reaches the store: 127.0.0.1 for this machine, else the route's
    source address."""
    return "127.0.0.1" if is_local(host) else source_address(host, ssh, known)


def prepare_gloo_job(
    rank_hosts: Sequence[str],
    common_env: Mapping[str, str],
    shim_argv: Sequence[str],
    python: str,
    ssh: SshOptions,
    ssh_args_env: Mapping[str, str],
    launcher_env: Mapping[str, str],
    host_iface: Mapping[str, str] | None = None,
    iface_cidrs: Sequence[str] = (),
    addresses: Mapping[str, str] | None = None,
    via_srun: bool = False,
    node_addresses: Mapping[str, str] | None = None,
) -> GlooJob:
    """Start the store and describe the job for the fan-out. `addresses` (tests): the store
    address per host instead of the route's. `via_srun`: inside a Slurm allocation, each
    host's agent is started as a one-task step on its node instead of over ssh;
    `node_addresses`: where the scheduler reaches each node, for names that do not resolve."""
    ranks = place_ranks(rank_hosts)
    hosts = list(dict.fromkeys(rank_hosts))
    where = dict(addresses or {})
    for host in hosts:
        if host not in where:
            where[host] = store_address(host, ssh, (node_addresses or {}).get(host))
    secret = new_secret()
    store = Store(sorted(set(where.values())), secret, scope_sizes(ranks))
    store.start()
    try:
        entries = []
        for host in hosts:
            env = dict(common_env)
            if host_iface and host in host_iface:
                env["HOROVOD_GLOO_IFACE"] = host_iface[host]
            job = agent_job(host, where[host], store.port, secret, env, shim_argv, iface_cidrs,
                            via_srun)
            job["ranks"] = [{"env": r.env(len(ranks))} for r in ranks if r.host == host]
            entries.append(host_entry(host, job, python, via_srun))
        fanout = tuple(agents.ship("gloo_start.py").here())
        env = dict(launcher_env)
        env.update(ssh_args_env)
        stdin = json.dumps({"hosts": entries}).encode("utf-8")
        return GlooJob(fanout, env, stdin, store)
    except BaseException:
        store.close()
        raise

