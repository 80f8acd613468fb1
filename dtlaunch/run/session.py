"""One run of a job, as a library call: decide the local MPI, plan, pre-flight, execute, re-check.

Nothing here prints. What happens along the way goes to `on_event` (the CLI renders it), and
what came of the run is returned as a `RunOutcome`, so the whole flow can be driven (and
tested) without the command line.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from dtlaunch.check.gpus import choose_slots, slots_pending, unchecked_slots_text, visible_devices
from dtlaunch.core.errors import EXIT_FAILURE, UsageError
from dtlaunch.core.interrupts import signals_raise
from dtlaunch.job.env import kept_home_note
from dtlaunch.job.hosts import Host
from dtlaunch.jobkind import JobContext, JobEnd, JobKind, Say, SayLevel, StartedJob, kind_for
from dtlaunch.mpi import SLURM, local_mpi
from dtlaunch.plan.plan import RunPlan, RunRequest, plan_run
from dtlaunch.probe import reach_for
from dtlaunch.run.events import HOSTS_CHECKED, Progress, progress_event
from dtlaunch.run.events import Event as Event  # the run's events, named here for its callers
from dtlaunch.run.events import EventLevel as EventLevel
from dtlaunch.run.events import OnEvent as OnEvent
from dtlaunch.run.failure_report import JobReport, build_report
from dtlaunch.run.request import LaunchRequest as LaunchRequest  # named here for its callers

if TYPE_CHECKING:
    from dtlaunch.check.network import NetworkChoice
    from dtlaunch.check.report import DoctorReport
    from dtlaunch.doctor.preflight import DeferredKeyCheck, PreflightFailure
    from dtlaunch.probe.prober import Reach
    from dtlaunch.run.execute import LaunchResult
    from dtlaunch.run.restarts import Attempt, AttemptOutcome, RestartReport


Executor = Callable[..., "LaunchResult"]


@dataclass(frozen=True)
class RunOutcome:
    plan: RunPlan
    preflight: DoctorReport | None  # the full checks' report, when they ran
    result: LaunchResult | None  # None: nothing was launched
    exit_code: int
    refused: PreflightFailure | None = None  # the pre-flight stopped the run
    report: JobReport | None = None  # how the job ended (None: nothing was launched)

    @property
    def error(self) -> str | None:
        """The pre-flight's one line, when it stopped the run."""
        return self.refused.describe() if self.refused is not None else None


@dataclass(frozen=True)
class Prepared:
    plan: RunPlan
    mpirun: str | None  # the local launcher's path; None only for a dry run without one
    request: RunRequest  # hosts, -np and via resolved (allocation)
    mpi_version: tuple[int, ...]
    provisional: bool  # planned before the GPUs decide the slots: plan again after
    # The plan again for a changed request (the network the pre-flight chose), as this one was.
    replan: Callable[[RunRequest], RunPlan]


def prepare(request: RunRequest, on_event: OnEvent, *, dry_run: bool = False,
            defer_slots: bool = False, kind: JobKind | None = None) -> Prepared:
    """Find and ask the local launcher (the request's kind says which), then build the plan.
    A dry run needs no launcher.

    Inside a scheduler's allocation the hosts come from it unless given (see dtlaunch.cluster.allocation).
    ``defer_slots``: the pre-flight will run, and hosts without written slots get one per
    GPU it finds; until then -np is not held against the stand-in single slots."""
    from dtlaunch.cluster.allocation import detect, plan_allocation

    env = dict(os.environ)
    placement = plan_allocation(request, detect(env), request.via)
    request = placement.request
    if request.via != SLURM:  # the job's links are this machine's ssh: choose its exchange
        from dtlaunch.reach.kex import for_local_ssh

        request = replace(request, ssh=for_local_ssh(request.ssh, env))
    if placement.allocation is not None:  # outside one, the hosts are what was typed
        on_event(Event(EventLevel.NOTE if dry_run else EventLevel.DETAIL, placement.source))
    family, program, impl = (kind or kind_for(request)).family(env)
    if program is None and not dry_run:
        raise UsageError(f"{family.launcher} not found on PATH; {family.install_hint}")
    if program is not None and impl is None:
        impl = local_mpi(family, program)
    elif program is not None and impl is not None:
        why = family.unsupported(impl, program)
        if why is not None:
            raise UsageError(f"{why}; {family.install_hint}")
    version = impl.release if impl is not None else ()
    pending = slots_pending(request.hosts)
    provisional = defer_slots and pending
    # The launcher's parameter files are read here, at the edge; the plan says what wins.
    set_in = family.stray_launcher_files(program) if program is not None else ()
    family.refuse_insecure_files(program or "", request.mpi_args, env)
    replan = functools.partial(plan_run, environ=env, family=family, mpi_version=version,
                               as_root=os.geteuid() == 0, cpu_count=os.cpu_count() or 1,
                               launcher_set_in=set_in)
    plan = replan(replace(request, oversubscribe=True) if provisional else request)
    if pending and not defer_slots:
        text = unchecked_slots_text(request.hosts, "a dry run does not probe the hosts"
                                    if dry_run else "planned without the pre-flight")
        if text is not None:
            on_event(Event(EventLevel.NOTE if dry_run and request.hosts else EventLevel.DETAIL,
                           text))
    for message in plan.env.warnings:
        on_event(Event(EventLevel.WARNING, message))
    kept = kept_home_note(env, plan.env)
    if kept is not None:
        on_event(Event(EventLevel.NOTE, kept))
    for name, value in plan.left_out_env:
        on_event(Event(EventLevel.NOTE, f"{name}={value} (from the environment) picks a "
                       f"launcher other than ssh for {family.launcher}; left out of its "
                       "environment, as this job starts its daemons over ssh across hosts"))
    for where in plan.launcher_overridden:
        on_event(Event(EventLevel.NOTE, f"{where} (a parameter file) picks a launcher other "
                       f"than ssh for {family.launcher}; overridden on its command line, as "
                       "this job starts its daemons over ssh across hosts"))
    return Prepared(plan, program, request, version, provisional, replan)


def dry_run(request: LaunchRequest, on_event: OnEvent) -> RunPlan:
    """`--dry-run`: the plan `start` would run for the same request, with no launcher needed, no
    host reached and nothing started. What the real run refuses before it starts (the restart
    policy against the planned ranks) the dry run refuses too, before any event is told."""
    told: list[Event] = []
    prepared = prepare(request.run, told.append, dry_run=True)
    if request.restarts is not None:
        from dtlaunch.run.restarts import check_policy

        check_policy(request.restarts, len(prepared.plan.rank_hosts))
    for event in told:
        on_event(event)
    return prepared.plan


def local_gpus(counts: Mapping[str, int]) -> dict[str, int]:
    """GPU counts with this machine's limited to CUDA_VISIBLE_DEVICES, which reaches the ranks
    started here (and only them)."""
    from dtlaunch.probe.prober import local_names

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return dict(counts)
    here = local_names()
    return {h: visible_devices(visible, n) if h in here else n for h, n in counts.items()}


@dataclass(frozen=True)
class JobOutcome:
    """How a job ended (run.session.start): the process's exit status, and either the single
    run's outcome or, under a restart policy, the attempts and why the loop stopped."""

    exit_code: int
    single: RunOutcome | None = None
    restarts: RestartReport | None = None


def start(request: LaunchRequest, on_event: OnEvent) -> JobOutcome:
    """The library's one entry for running a job: one run (`launch`), or under the request's
    restart policy (--max-restarts) the attempts of the restart loop, each `launch_attempt`.
    The caller renders what comes back (console/render.py)."""
    policy = request.restarts
    if policy is None:
        outcome = launch(request, on_event)
        return JobOutcome(outcome.exit_code, single=outcome)
    from dtlaunch.run.restarts import Attempt, check_policy, run_attempts

    # Each attempt is a single run: the policy stays with the loop. The attempts keep the slots
    # planned here: one per GPU needs the pre-flight first, which the loop does not run before
    # it starts, so hosts without written slots keep 1.
    request = replace(request, restarts=None, max_restarts=policy.max_restarts, run=replace(
        request.run, hosts=tuple(Host(h.name, h.slots) for h in request.run.hosts)))
    plan = prepare(request.run, on_event).plan
    check_policy(policy, len(plan.rank_hosts))
    # --timeout is the whole job's: each attempt gets what is left of it.
    deadline = time.time() + request.timeout if request.timeout is not None else None
    report = run_attempts(Attempt(0, plan.hosts, len(plan.rank_hosts), deadline), policy,
                          functools.partial(launch_attempt, request, on_event=on_event),
                          functools.partial(recheck, request) if request.check else None,
                          on_event)
    return JobOutcome(report.exit_code, restarts=report)


def launch_attempt(request: LaunchRequest, attempt: Attempt, on_event: OnEvent,
                   ) -> AttemptOutcome:
    """One attempt of a --max-restarts job: a single run on the attempt's hosts, its ranks told
    its number. The first runs the ordinary pre-flight; later ones were re-checked just before."""
    from dtlaunch.core.failure import Failure
    from dtlaunch.run.restarts import AttemptOutcome, with_restart_count

    n = attempt.number
    run = replace(request.run, hosts=attempt.hosts, num_proc=attempt.num_proc,
                  env_items=with_restart_count(request.run.env_items, n))
    outcome = launch(replace(request, run=run, check=request.check and n == 0, attempt=n,
                             deadline=attempt.deadline,
                             log_label=f"attempt {n + 1} (DTLAUNCH_RESTART_COUNT={n})"),
                     on_event)
    if outcome.result is None:
        for line in (outcome.error or "pre-flight checks failed").splitlines():
            on_event(Event(EventLevel.NOTE, line))
        return AttemptOutcome(outcome.exit_code, Failure(reason=outcome.error or "pre-flight"))
    if outcome.report is not None and outcome.exit_code != 0:
        # Each failed attempt's root cause, as a single run reports it.
        on_event(Event(EventLevel.REPORT, f"attempt {n + 1} ended", report=outcome.report))
    ended = outcome.result
    return AttemptOutcome(ended.exit_code, ended.failure, ended.interrupted_by, ended.timed_out)


def recheck(request: LaunchRequest, hosts: tuple[Host, ...], left: float | None,
            ) -> dict[str, str]:
    """Before a restart: the full pre-flight of `hosts` (never the cache: a host that just
    failed must prove itself), within `left` seconds of the job's --timeout. Each failing host
    with its first failed check. A signal raises (KeyboardInterrupt, Interrupted)."""
    from dtlaunch.doctor.doctor import COMMAND_TIMEOUT
    from dtlaunch.doctor.preflight import run_preflight

    prepared = prepare(replace(request.run, hosts=hosts, num_proc=None), lambda event: None)
    run = prepared.request
    # Inside a Slurm job the re-check goes through srun like the first pre-flight: the
    # allocated nodes may not be reachable over SSH at all.
    reach = reach_for(run.via, run.ssh)
    limit = request.start_timeout
    if left is not None:  # the re-check too ends by the job's deadline
        limit = max(1.0, min(limit if limit is not None else COMMAND_TIMEOUT, left))
    with signals_raise():
        checked = run_preflight(run, prepared.plan, job_started=True, reach=reach,
                                command_timeout=limit)
    if checked.report is None:
        return {}
    names = {h.name for h in hosts}
    failing: dict[str, str] = {}
    for host, check in checked.report.failures():
        if host in names:  # its first failed check
            failing.setdefault(host, f"{checked.report.label(check.name)}: {check.detail}")
    return failing


def launch(request: LaunchRequest, on_event: OnEvent, *, executor: Executor | None = None,
           reach: Reach | None = None) -> RunOutcome:
    """One run, in a straight line: the request's kind, the plan, the pre-flight, the job the
    kind starts, its end; and when a job started on a cached pre-flight fails because a host
    key went bad, the checks again.
    `executor` runs the job (default: run.execute); `reach`: how the checks reach the hosts
    (default: dtlaunch.probe.reach_for, by the request's via)."""
    def say(level: SayLevel, text: str) -> None:
        on_event(Event(EventLevel(level), text))

    kind = kind_for(request.run)
    prepared = prepare(kind.first_request(request.run, say), on_event, kind=kind,
                       defer_slots=request.check)
    run_request = prepared.request
    if reach is None and request.check:  # --no-check reaches no host before the job
        reach = reach_for(run_request.via, run_request.ssh)
    checked = _preflight(request, prepared, run_request, reach, on_event)
    if isinstance(checked, RunOutcome):
        return checked
    plan, run, network, keys = checked
    on_event(Event(EventLevel.DETAIL, "running: " + plan.display()))
    job = kind.start(_context(request, prepared, plan, run, network, reach, say))
    result = _execute(request, plan, run_request, job, prepared, on_event, executor)
    end = job.finish(JobEnd(result.exit_code, result.failure, stopped=result.stopped))
    if (end.exit_code, end.failure) != (result.exit_code, result.failure):
        result = replace(result, exit_code=end.exit_code, failure=end.failure)
    result = _blamed(result, run_request)
    # How the job ended, root cause first (see failure_report); the CLI renders it.
    report = build_report(result.exit_code, result.failure, result.ranks,
                          interrupted_by=result.interrupted_by, timed_out=result.timed_out,
                          timeout=request.timeout)
    if keys is not None and result.exit_code != 0 and not result.stopped and keys.failed():
        from dtlaunch.doctor.preflight import preflight_failure, run_preflight

        with signals_raise():
            # A host key changed (or vanished) since the cached pre-flight, and ssh refused
            # the host: the full checks name it and the fix.
            assert reach is not None  # keys come from a pre-flight, which had one
            again = run_preflight(run_request, plan, job_started=True, reach=reach,
                                  command_timeout=request.start_timeout)
        if not again.ok:
            return RunOutcome(plan, again.report, result, EXIT_FAILURE,
                              preflight_failure(again.report, job_started=True), report)
    return RunOutcome(plan, None, result, result.exit_code, report=report)


Checked = tuple[RunPlan, RunRequest, "NetworkChoice | None", "DeferredKeyCheck | None"]


def _preflight(request: LaunchRequest, prepared: Prepared, run_request: RunRequest,
               reach: Reach | None, on_event: OnEvent) -> Checked | RunOutcome:
    """The pre-flight (unless --no-check), and the plan again for what it chose: the network,
    and the slots of hosts given without them (one per GPU). A refusal is the run's outcome."""
    plan = prepared.plan
    if not request.check:
        return plan, run_request, None, None
    from dtlaunch.doctor.preflight import preflight_failure, run_preflight

    assert reach is not None
    with signals_raise():
        checked = run_preflight(run_request, plan, reach=reach, use_cache=request.use_cache,
                                command_timeout=request.start_timeout,
                                progress=lambda done, total, _host: on_event(progress_event(
                                    Progress(HOSTS_CHECKED, done, total))))
    if checked.message:
        on_event(Event(EventLevel.DETAIL, checked.message))
    for warning in checked.warnings:
        on_event(Event(EventLevel.WARNING, warning))
    if not checked.ok:
        from dtlaunch.doctor.preflight import elastic_survivors

        # An elastic job leaves a failing host out, at the start as mid-job, while the
        # others have its slots; the checks run again on those.
        kept = elastic_survivors(run_request, checked.report)
        if kept is None:
            return RunOutcome(plan, checked.report, None, EXIT_FAILURE,
                              preflight_failure(checked.report, job_started=False))
        for host, why in kept[1].items():
            on_event(Event(EventLevel.WARNING, f"elastic: host {host} left out: {why}"))
        fewer = replace(prepared, plan=prepared.replan(kept[0]), request=kept[0])
        return _preflight(request, fewer, kept[0], reach, on_event)
    choice = checked.network
    run = run_request
    if choice is not None and choice.iface is not None and run_request.iface is None:
        iface = plan.family.job_iface(choice.iface, choice.gloo_iface)
        run = replace(run_request, iface=iface, extra_env=(*choice.env(), *run_request.extra_env))
        on_event(Event(EventLevel.NOTE, choice.describe()))
    if prepared.provisional:
        slots = choose_slots(run.hosts, local_gpus(checked.gpus or {}), run.num_proc)
        run = replace(run, hosts=slots.hosts) if slots.changed else run
        on_event(Event(EventLevel.NOTE if slots.changed else EventLevel.DETAIL, slots.text))
    if run is not run_request or prepared.provisional:
        plan = prepared.replan(run)
    return plan, run, choice, checked.keys


def _context(request: LaunchRequest, prepared: Prepared, plan: RunPlan, run: RunRequest,
             network: NetworkChoice | None, reach: Reach | None, say: Say) -> JobContext:
    """What the request's kind needs to start its job, the run's services among it."""
    from dtlaunch.agents import PIPE_BUF, ship
    from dtlaunch.plan.plan import build_program, shim_python

    def node_addresses(hosts: Sequence[str]) -> Mapping[str, str]:
        from dtlaunch.cluster.slurm import node_addresses

        return node_addresses(hosts)  # scontrol: asked only inside a Slurm allocation

    def admit(host: str) -> str | None:
        """A host that joins later passes the same pre-flight first (unless --no-check)."""
        if not request.check or reach is None:
            return None
        from dtlaunch.doctor.preflight import left_out_reason, run_preflight

        one = replace(run, hosts=(Host(host, 1),), num_proc=1, elastic=None)
        # Planned as the job was (prepare's replan). The one kind that admits hosts, elastic,
        # has no MPI launcher: no MPI version and no parameter file's choice go into it.
        checked = run_preflight(one, prepared.replan(one), reach=reach,
                                use_cache=request.use_cache, command_timeout=request.start_timeout)
        return None if checked.ok else left_out_reason(checked.report)

    program = ship("rank_shim.py").inline(build_program(run), shim_python(run), PIPE_BUF)
    return JobContext(run, plan, prepared.mpirun, network, program,
                      shim_python(run), say=say, admit=admit, node_addresses=node_addresses,
                      attempt=request.attempt, max_restarts=request.max_restarts)


def _execute(request: LaunchRequest, plan: RunPlan, run_request: RunRequest, job: StartedJob,
             prepared: Prepared, on_event: OnEvent, executor: Executor | None) -> LaunchResult:
    """Run the kind's job to its end (run.execute), watching Slurm's nodes inside a Slurm
    allocation (no ssh link there shows a lost node); the kind closes what it opened."""
    if executor is None:
        from dtlaunch.run.execute import execute

        executor = execute
    nodes = None
    if run_request.via == SLURM:  # an ssh job's links show a lost host themselves
        from dtlaunch.run.slurm_watch import node_watch_for

        nodes = node_watch_for(run_request.via, plan.rank_hosts, run_request.python)
    shown = None
    if request.ranks is not None:
        shown = request.ranks.shown(plan.rank_hosts)
        unused = request.ranks.unused(plan.rank_hosts)
        if unused is not None:
            on_event(Event(EventLevel.WARNING, unused))
    timeout, total = request.timeout, None
    if request.deadline is not None:
        timeout, total = max(request.deadline - time.time(), 0.001), request.timeout
    output_dir = None
    if request.output_dir:
        from pathlib import Path  # only --output-dir's files need it (~10 ms of imports)

        output_dir = Path(request.output_dir)
    try:
        result = executor(
            job.argv, job.env, plan.rank_hosts, timeout=timeout, timeout_total=total,
            log_label=request.log_label,
            output_dir=output_dir,
            announce=lambda text: on_event(Event(EventLevel.NOTE, text)),
            stop_when=nodes.stop_reason if nodes is not None else None,
            family=job.family, support_files=plan.support_files,
            new_demux=functools.partial(plan.family.new_demux, release=prepared.mpi_version),
            prefix_timestamp=request.prefix_timestamp, shown_ranks=shown,
            ranks_to_stderr=request.ranks_to_stderr,
            on_progress=lambda progress: on_event(progress_event(progress)),
            stdin_data=job.stdin, on_lost_host=job.on_lost_host)
    finally:
        if nodes is not None:
            nodes.close()
        job.close()  # the kind's rendezvous lives exactly as long as the job
    if nodes is None:
        return result
    from dtlaunch.run.slurm_watch import blame

    return blame(result, nodes)


def _blamed(result: LaunchResult, run_request: RunRequest) -> LaunchResult:
    """The failure named as the user can act on it: a Slurm allocation's end, an option of
    --mpi-args the launcher refused."""
    if run_request.via == SLURM:
        from dtlaunch.run.slurm_watch import blame_allocation

        result = blame_allocation(result, os.environ.get("SLURM_JOB_ID"))
    if result.failure is not None and result.failure.option is not None:
        from dtlaunch.core.failure import blame_mpi_args

        result = replace(result, failure=blame_mpi_args(result.failure, run_request.mpi_args))
    return result
