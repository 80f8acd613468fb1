"""The Gloo job kind (`--gloo`): no MPI; dtlaunch's fan-out starts one agent per host (over
ssh, or a one-task srun step inside a Slurm allocation), which starts the host's ranks with
their Gloo contract, and dtlaunch's signed rendezvous store lives exactly as long as the job."""

from __future__ import annotations

import json

from dtlaunch import agents
from dtlaunch.gloo.family import GLOO
from dtlaunch.gloo.ranks import host_ifaces, place_ranks, scope_sizes
from dtlaunch.gloo.rendezvous import Store
from dtlaunch.gloo.start import agent_job, host_entry, store_address
from dtlaunch.jobkind import JobContext, OwnFanout, StartedJob
from dtlaunch.mpi import SLURM


class GlooJobKind(OwnFanout):
    name = "gloo"
    FAMILY = GLOO

    def start(self, context: JobContext) -> StartedJob:
        """The store started, and the job for the fan-out (dtlaunch.agents.gloo_start), which
        goes to it on standard input: the planned variables for every rank, each rank's Gloo
        contract, each host's interface on the chosen network. Inside a Slurm allocation each
        host reaches the store from where the scheduler reaches its node."""
        request, plan, network = context.request, context.plan, context.network
        common = {v.name: v.value for v in plan.env.variables}
        ranks = place_ranks(plan.rank_hosts)
        hosts = list(dict.fromkeys(plan.rank_hosts))
        ifaces = host_ifaces(network.names, network.gloo_iface, hosts) if network else {}
        cidrs = request.iface.cidrs if request.iface is not None else ()
        via_srun = request.via == SLURM
        nodes = dict(context.node_addresses(hosts)) if via_srun else {}
        where = {host: store_address(host, request.ssh, nodes.get(host)) for host in hosts}
        store = Store(sorted(set(where.values())), scope_sizes=scope_sizes(ranks))
        store.start()
        try:
            entries = []
            for host in hosts:
                env = dict(common)
                if host in ifaces:
                    env["HOROVOD_GLOO_IFACE"] = ifaces[host]
                job = agent_job(host, env, context.rank_program, via_srun,
                                store=store.reached_at(where[host]), iface_cidrs=list(cidrs),
                                ranks=[{"env": r.env(len(ranks))} for r in ranks if r.host == host])
                entries.append(host_entry(host, job, context.python, via_srun))
            return StartedJob(tuple(agents.ship("gloo_start.py").here()), dict(plan.launcher_env),
                              GLOO, stdin=json.dumps({"hosts": entries}).encode("utf-8"),
                              close=store.close)
        except BaseException:
            store.close()
            raise


GLOO_JOB = GlooJobKind()
