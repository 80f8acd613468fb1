"""A run in Horovod's elastic mode: its first hosts found before the plan, each later host
checked by the pre-flight before it joins, the driver's end turned into the run's result."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from dtlaunch.core.failure import Failure
from dtlaunch.elastic.discovery import DiscoveryError, FixedDiscovery, ScriptDiscovery
from dtlaunch.elastic.driver import Outcome
from dtlaunch.elastic.hosts import assign
from dtlaunch.job.elastic import ElasticSpec
from dtlaunch.job.hosts import Host
from dtlaunch.plan.plan import RunRequest

if TYPE_CHECKING:
    from dtlaunch.run.execute import LaunchResult

Discover = Callable[[], dict[str, int]]


def discovery_for(request: RunRequest) -> Discover:
    spec = request.elastic
    assert spec is not None
    if spec.discovery_script is not None:
        return ScriptDiscovery(spec.discovery_script, spec.slots_per_host, spec.discovery_timeout)
    return FixedDiscovery({h.name: h.slots for h in request.hosts})


def first_hosts(request: RunRequest, discover: Discover,
                say: Callable[[str], None] = lambda text: None,
                clock: Callable[[], float] = time.monotonic) -> RunRequest:
    """The request on the hosts discovery lists now, once they have --min-np (or -np) slots,
    waiting up to --elastic-timeout; a script that fails the first time ends the run."""
    spec: ElasticSpec = request.elastic  # type: ignore[assignment]
    deadline = clock() + spec.timeout
    told = False
    while True:
        try:
            found = discover()
        except DiscoveryError as exc:
            raise DiscoveryError(f"--host-discovery-script: {exc}") from None
        if sum(found.values()) >= spec.start_np:
            break
        if clock() >= deadline:
            listed = ", ".join(f"{h}:{n}" for h, n in found.items()) or "no host"
            raise DiscoveryError(f"elastic: {sum(found.values())} slot(s) ({listed}) after "
                                 f"waiting {spec.timeout:g} s for {spec.start_np}")
        if not told:
            say(f"elastic: waiting up to {spec.timeout:g} s for {spec.start_np} slot(s)")
            told = True
        time.sleep(1.0)
    ranks = assign(found, spec.max_np)
    hosts = tuple(Host(h, n) for h, n in found.items())
    return replace(request, hosts=hosts, num_proc=len(ranks))


def elastic_result(result: LaunchResult, outcome: Outcome | None) -> LaunchResult:
    """The run's end as the driver saw it: recovered failures are not the job's; a worker's
    failure that ended it is named by its worker number (the output's tag) and host."""
    if outcome is None or result.interrupted_by is not None or result.timed_out:
        return result
    if outcome.code == 0:
        return replace(result, exit_code=0, failure=None)
    worker = outcome.worker
    if worker is not None:
        code = outcome.code
        failure = Failure(worker.id, worker.slot.host, exit_code=code if code < 128 else None,
                          signal=code - 128 if code > 128 else None)
        return replace(result, exit_code=code, failure=failure)
    why = outcome.message or "elastic: the job failed"
    return replace(result, exit_code=outcome.code or 1, failure=Failure(reason=why))
