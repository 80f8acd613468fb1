"""The elastic job kind (Horovod's elastic mode): its first hosts found before the plan, its
driver on the hosts the pre-flight passed, each later host checked by the same pre-flight
before it joins (the run's `admit`), the driver's end turned into the run's result."""

from __future__ import annotations

import contextlib
import functools
import json
import queue
import time
from collections.abc import Callable
from dataclasses import replace
from typing import IO

from dtlaunch import agents
from dtlaunch.core.errors import DtlaunchError
from dtlaunch.core.failure import Failure
from dtlaunch.elastic.discovery import DiscoveryError, parse_hosts, run_script
from dtlaunch.elastic.driver import DRAIN_HOLD, ElasticDriver, Outcome, assign
from dtlaunch.gloo.family import ELASTIC_GLOO
from dtlaunch.gloo.ranks import host_ifaces
from dtlaunch.gloo.rendezvous import Store
from dtlaunch.gloo.start import agent_job, host_entry, store_address
from dtlaunch.job.elastic import DISCOVERY_TIMEOUT
from dtlaunch.job.hosts import Host
from dtlaunch.jobkind import JobContext, JobEnd, OwnFanout, Say, StartedJob
from dtlaunch.mpi import SLURM
from dtlaunch.plan.plan import RunRequest

Discover = Callable[[], dict[str, int]]


def discovery_for(request: RunRequest) -> Discover:
    spec = request.elastic
    assert spec is not None
    script = spec.discovery_script
    if script is not None:
        return lambda: parse_hosts(run_script(script, DISCOVERY_TIMEOUT), spec.slots_per_host)
    hosts = {h.name: h.slots for h in request.hosts}
    return lambda: dict(hosts)


def first_hosts(request: RunRequest, discover: Discover,
                say: Say = lambda level, text: None) -> RunRequest:
    """The request on the hosts discovery lists now, once they have --min-np (or -np) slots,
    waiting up to --elastic-timeout; a script that fails the first time ends the run."""
    spec = request.elastic
    assert spec is not None
    deadline = time.monotonic() + spec.timeout
    told = False
    while True:
        try:
            found = discover()
        except DiscoveryError as exc:
            raise DiscoveryError(f"--host-discovery-script: {exc}") from None
        if sum(found.values()) >= spec.start_np:
            break
        if time.monotonic() >= deadline:
            listed = ", ".join(f"{h}:{n}" for h, n in found.items()) or "no host"
            raise DiscoveryError(f"elastic: {sum(found.values())} slot(s) ({listed}) after "
                                 f"waiting {spec.timeout:g} s for {spec.start_np}")
        if not told:
            say("note", f"elastic: waiting up to {spec.timeout:g} s for {spec.start_np} slot(s)")
            told = True
        time.sleep(1.0)
    ranks = assign(found, spec.max_np)
    # Only the hosts that take ranks are planned and checked now (thousands listed with
    # --max-np 2 are not all pre-flighted); discovery checks the others when they are needed.
    used = set(ranks)
    hosts = tuple(Host(h, n) for h, n in found.items() if h in used)
    return replace(request, hosts=hosts, num_proc=len(ranks))


class ElasticJobKind(OwnFanout):
    name = "elastic"
    FAMILY = ELASTIC_GLOO

    def first_request(self, request: RunRequest, say: Say) -> RunRequest:
        return first_hosts(request, discovery_for(request), say)

    def start(self, context: JobContext) -> StartedJob:
        """The rendezvous store with the driver's scopes, the driver, and the fan-out
        (dtlaunch.agents.gloo_start, as for a fixed Gloo job) that gets each host's agent as the
        driver first assigns it ranks."""
        request, plan, network = context.request, context.plan, context.network
        spec = request.elastic
        assert spec is not None
        names = network.names if network is not None else ()
        common_iface = network.gloo_iface if network is not None else None
        via_srun = request.via == SLURM

        def address(host: str) -> str:
            known = context.node_addresses([host]).get(host) if via_srun else None
            return store_address(host, request.ssh, known)

        addresses = {h.name: address(h.name) for h in request.hosts}
        store = Store(sorted(set(addresses.values())))
        lines: queue.Queue[bytes] = queue.Queue()

        def start_host(host: str, token: int) -> None:
            try:
                where = addresses.get(host) or address(host)
                store.listen_also(where)
            except DtlaunchError as exc:
                # Its agent would never reach the store: the driver takes the host for lost.
                context.say("warning", f"elastic: host {host} cannot be started: {exc}")
                return
            addresses[host] = where
            env = {v.name: v.value for v in plan.env.variables}
            iface = host_ifaces(names, common_iface, [host]).get(host)
            if iface is not None:
                env["HOROVOD_GLOO_IFACE"] = iface
            job = agent_job(host, env, context.rank_program, via_srun, store=store.reached_at(where),
                            iface_cidrs=list(request.iface.cidrs if request.iface is not None else ()),
                            elastic=True, token=token, round_timeout=spec.timeout + DRAIN_HOLD + 120)
            lines.put(json.dumps(host_entry(host, job, context.python, via_srun)).encode() + b"\n")

        def admit(host: str) -> str | None:
            try:
                addresses.setdefault(host, address(host))
            except Exception as exc:
                return str(exc)
            return context.admit(host)

        driver = ElasticDriver(spec, discovery_for(request), start_host, store.reset_round,
                               admit=admit, say=context.say)
        store.hooks = driver.hooks()
        store.start()
        try:
            driver.start({h.name: h.slots for h in request.hosts})
        except BaseException:
            store.close()
            raise

        def finish(end: JobEnd) -> JobEnd:
            """The run's end as the driver saw it: recovered failures are not the job's; a
            worker's failure that ended it is named by its worker number (its tag) and host."""
            driver.stop(Outcome(end.exit_code or 1, "the job was stopped"))
            outcome = driver.outcome
            if outcome is None or end.stopped:
                return end
            code, worker = outcome.code, outcome.worker
            if code == 0:
                return replace(end, exit_code=0, failure=None)
            if worker is not None:
                failure = Failure(worker.id, worker.slot.host, exit_code=code if code < 128 else None,
                                  signal=code - 128 if code > 128 else None)
                return replace(end, exit_code=code, failure=failure)
            why = outcome.message or "elastic: the job failed"
            return replace(end, exit_code=code, failure=Failure(reason=why))

        return StartedJob(tuple(agents.ship("gloo_start.py").here()), dict(plan.launcher_env),
                          ELASTIC_GLOO, stdin=functools.partial(_feed, lines, driver),
                          on_lost_host=driver.host_lost, close=store.close, finish=finish)


def _feed(lines: queue.Queue[bytes], driver: ElasticDriver, stdin: IO[bytes]) -> None:
    """The fan-out's input for the job's life: each host's entry as the driver starts it. Its
    end ends every agent (the driver finished, or dtlaunch stopped the job)."""
    try:
        stdin.write(json.dumps({"elastic": True, "hosts": []}).encode() + b"\n")
        stdin.flush()
        while True:
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                if driver.finished:
                    break
                continue
            stdin.write(line)
            stdin.flush()
    except (OSError, ValueError):
        pass
    finally:
        with contextlib.suppress(OSError, ValueError):
            stdin.close()


ELASTIC_JOB = ElasticJobKind()
