"""The torch.distributed job kind (`dtlaunch run --torch`): one agent per host
(dtlaunch.agents.torch_host, over ssh or a one-task srun step), started by the same fan-out as
a Gloo job's, gives each worker torchrun's contract (ranks.py); host 0's agent holds the master
address and port and serves the job's c10d store, which admits the job's processes only; a
new attempt (--max-restarts) gets a new store, a new secret and TORCHELASTIC_RESTART_COUNT + 1.
Its family (the MpiFamily seam, TORCH) is Gloo's with its own words: no MPI, output and failures
that read the same, and a shown command (`dtlaunch-torch -np N -H HOSTS PROGRAM...`) that names
what runs.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence

from dtlaunch import agents
from dtlaunch.gloo.family import Gloo
from dtlaunch.gloo.start import agent_job, host_addresses, host_entry, is_local, store_address
from dtlaunch.jobkind import JobContext, OwnFanout, StartedJob
from dtlaunch.mpi import SLURM, HostNeeds
from dtlaunch.plan.plan import build_program, shim_python
from dtlaunch.reach.ssh_options import SshOptions
from dtlaunch.torchrun.options import TorchSpec
from dtlaunch.torchrun.ranks import place_workers, program_for, worker_env


class TorchDistributed(Gloo):
    name = "torch.distributed"
    launcher = "dtlaunch-torch"
    prefix = "dtlaunch-torch: "
    needs = HostNeeds(mpi=False, horovod=None, option="--torch")  # the same PyTorch everywhere
    install_hint = "torch.distributed needs PyTorch (the same release) on every host"


TORCH = TorchDistributed()

# Placeholders the fan-out fills once host 0's agent has bound the master address and port
# (agents/gloo_start.py).
MASTER_ADDR, MASTER_PORT = "@DTLAUNCH_MASTER_ADDR@", "@DTLAUNCH_MASTER_PORT@"


def master_hint(hosts: Sequence[str], ssh: SshOptions, node_address: str | None) -> str:
    """Where host 0's agent binds the master when no subnet of the job's says: the address
    dtlaunch reaches host 0 at (this machine's towards the next host when host 0 is this
    machine; loopback when every host is)."""
    first = hosts[0]
    if is_local(first):
        other = next((h for h in hosts if not is_local(h)), None)
        return store_address(other, ssh) if other else "127.0.0.1"
    _, infos = host_addresses(first, ssh, node_address, "--torch", ", where the job's store is held")
    return str(infos[0][4][0])  # an IPv4 address where the host has one (host_addresses' order)


class TorchJobKind(OwnFanout):
    name = "torch"
    FAMILY = TORCH

    def start(self, context: JobContext) -> StartedJob:
        request, plan, network = context.request, context.plan, context.network
        spec = request.spec if isinstance(request.spec, TorchSpec) else TorchSpec()
        via_srun = request.via == SLURM
        hosts = list(dict.fromkeys(plan.rank_hosts))
        nodes = dict(context.node_addresses(hosts)) if via_srun else {}
        common = {v.name: v.value for v in plan.env.variables}
        names = dict(network.names) if network is not None else {}
        workers = place_workers(plan.rank_hosts)
        run_id = "dtlaunch-" + secrets.token_hex(6)
        secret = secrets.token_hex(32)
        program = build_program(request)
        python = shim_python(request)
        arg = spec.local_rank_arg
        entries = []
        for index, host in enumerate(hosts):
            env = dict(common)  # the job's own values win over the chosen network's
            if host in names:  # Gloo takes one interface, NCCL a list
                env.setdefault("GLOO_SOCKET_IFNAME", names[host][0])
                env.setdefault("NCCL_SOCKET_IFNAME", ",".join(names[host]))
            ranks = [{"env": worker_env(w, len(workers), len(hosts), attempt=context.attempt,
                                        max_restarts=context.max_restarts, run_id=run_id,
                                        user_env=common),
                      "argv": list(agents.ship("rank_shim.py").inline(
                          program_for(program, w.local_rank, arg), python, agents.PIPE_BUF))}
                     for w in workers if w.host == host]
            serve = index == 0
            # peers: host 0 serves until each other host's agent has come and gone (torch_host).
            c10d = {"serve": serve, "secret": secret, "peers": len(hosts) - 1 if serve else 0,
                    "addr": master_hint(hosts, request.ssh, nodes.get(host)) if serve else MASTER_ADDR,
                    "port": (spec.master_port or 0) if serve else MASTER_PORT,
                    "cidrs": list(network.cidrs if network is not None else
                                  request.iface.cidrs if request.iface is not None else ())}
            job = agent_job(host, env, context.rank_program, via_srun, ranks=ranks, c10d=c10d)
            entries.append(host_entry(host, job, context.python, via_srun, "torch_host.py"))
        stdin = json.dumps({"hosts": entries, "prefix": TORCH.prefix}).encode("utf-8")
        return StartedJob(tuple(agents.ship("gloo_start.py").here()), dict(plan.launcher_env),
                          TORCH, stdin=stdin)


TORCH_JOB = TorchJobKind()
