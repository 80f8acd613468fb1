"""The Gloo job kind (`--gloo`): no MPI; dtlaunch's fan-out starts one agent per host (over
ssh, or a one-task srun step inside a Slurm allocation), which starts the host's ranks with
their Gloo contract, and dtlaunch's signed rendezvous store lives exactly as long as the job."""

from __future__ import annotations

from dtlaunch.gloo.family import GLOO
from dtlaunch.gloo.ranks import host_ifaces
from dtlaunch.gloo.start import prepare_gloo_job
from dtlaunch.jobkind import JobContext, OwnFanout, StartedJob
from dtlaunch.mpi import SLURM


class GlooJobKind(OwnFanout):
    name = "gloo"
    FAMILY = GLOO


    def start(self, context: JobContext) -> StartedJob:
        """The planned variables for every rank, each rank's Gloo contract, each host's
        interface on the chosen network; the rendezvous started."""
        request, plan, network = context.request, context.plan, context.network
        common = {v.name: v.value for v in plan.env.variables}
        hosts = list(dict.fromkeys(plan.rank_hosts))
        ifaces = host_ifaces(network.names, network.gloo_iface, hosts) if network else {}
        cidrs = request.iface.cidrs if request.iface is not None else ()
        via_srun = request.via == SLURM
        job = prepare_gloo_job(plan.rank_hosts, common, context.rank_program, context.python,
                               request.ssh, {}, plan.launcher_env, host_iface=ifaces,
                               iface_cidrs=cidrs, via_srun=via_srun,
                               node_addresses=dict(context.node_addresses(hosts))
                               if via_srun else None)
        return StartedJob(job.argv, job.env, GLOO, stdin=job.stdin, close=job.store.close)


GLOO_JOB = GlooJobKind()
