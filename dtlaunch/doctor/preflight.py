"""`dtlaunch run`'s pre-flight: the doctor's checks for exactly what the job needs.

A launch is refused on any failure; the caller shows the same table and fixes as `dtlaunch doctor`.

To keep the pre-flight cheap, a successful result is remembered for five minutes
(preflight_cache.py: a private file, keyed by what the job depends on). A changed host key is
never hidden by the cache: the launcher's ssh refuses such a host, and when a job started on a
cache hit fails, every host key is checked; a bad one drops the cache and the full checks run to
report it (DeferredKeyCheck says why waiting for the failure is safe). Where dtlaunch does not
control the launcher's ssh, the keys are checked before the launch. DTLAUNCH_PREFLIGHT_CACHE=0
always runs the full checks.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from dtlaunch.doctor.preflight_cache import (
    cache_key,
    cache_problem,
    cached_entry,
    checked_program,
    drop_cache,
    write_cache,
)
from dtlaunch.probe.prober import Prober, Reach, fan_out, local_names

if TYPE_CHECKING:
    from dtlaunch.check.network import NetworkChoice
    from dtlaunch.check.report import DoctorReport
    from dtlaunch.mpi import MpiFamily
    from dtlaunch.plan.plan import RunPlan, RunRequest


def host_key_failures(hosts: tuple[str, ...], prober: Prober) -> dict[str, str]:
    """The prober's cheap check (SSH: key exchange, no login) on every remote host in
    parallel. Returns host -> failure kind for each host that failed or did not answer."""
    remote = [h for h in hosts if h not in local_names()]
    if not remote:
        return {}

    def fallback(host: str, exc: BaseException | None) -> str | None:
        return "timeout" if exc is None else "error"  # any crash counts as a failure

    try:
        prober.prepare()  # the threads import nothing (see Prober.prepare)
        kinds = fan_out(remote, prober.verify, fallback, prober.connect_timeout + 1)
    finally:
        prober.close()
    return {host: kind for host, kind in zip(remote, kinds) if kind is not None}


@dataclass(frozen=True)
class DeferredKeyCheck:
    """A cache hit's host-key check, made only when the job fails.

    This is safe because the launcher's ssh (dtlaunch's wrapper, with BatchMode and
    StrictHostKeyChecking=yes, or accept-new when asked) is OpenSSH itself: it refuses to log
    in to a host whose key is unknown or changed, so nothing ever runs on such a host, and
    the job fails at its start. Only then is this check made, and when it finds a bad key the
    caller runs the full checks, whose report names the host and the fix. A job that succeeds
    pays nothing for it: the check imports paramiko and does a key exchange with every host,
    about 0.3 s of CPU while the ranks start (measured: +0.1 to 0.35 s on a 3-second job).
    """

    hosts: tuple[str, ...]
    prober: Callable[[], Prober]

    def failed(self) -> bool:
        """True if a host's key is unknown or changed (bounded by the connect timeout)."""
        from dtlaunch.reach.ssh_errors import CHANGED_HOST_KEY, UNKNOWN_HOST_KEY

        failures = host_key_failures(self.hosts, self.prober())
        return any(kind in (CHANGED_HOST_KEY, UNKNOWN_HOST_KEY) for kind in failures.values())


def may_overlap(request: RunRequest, family: MpiFamily,
                launcher_env: Mapping[str, str] | None = None, launcher: str = "") -> bool:
    """The key check may wait for a failed job only while dtlaunch controls the launcher's
    ssh: extra launcher arguments, MCA variables or Open MPI's default parameter files could
    weaken its host-key checking."""
    env = os.environ if launcher_env is None else launcher_env
    return family.ssh_left_to_dtlaunch(request.mpi_args, env) and not family.ssh_setting_files(launcher)


@dataclass(frozen=True)
class PreflightOutcome:
    """What the pre-flight found: the full checks' report, or a cache hit (report None)."""

    report: DoctorReport | None = None
    keys: DeferredKeyCheck | None = None  # a cache hit's key check, made if the job fails
    network: NetworkChoice | None = None  # the network chosen for a run without --iface
    message: str = ""  # what happened, for --verbose
    gpus: dict[str, int] | None = None  # NVIDIA GPUs per host (None: not known)
    warnings: tuple[str, ...] = ()  # one line each (a cache that could not be used)

    @property
    def ok(self) -> bool:
        return self.report is None or self.report.ok


@dataclass(frozen=True)
class PreflightFailure:
    """Why the pre-flight stopped a run: each failing host with the check it failed (the reach
    check named by how hosts were reached, ssh or srun), and whether the job had started."""

    failing: tuple[tuple[str, str], ...]  # (host, check)
    job_started: bool

    def describe(self) -> str:
        """The one line that ends the run (console/render.py shows it; the restart loop and
        elastic mode's admission quote it)."""
        bad = sorted({f"{host} ({check})" for host, check in self.failing})
        outcome = "the job did not start" if self.job_started else "not launching"
        return ("pre-flight checks failed: " + ", ".join(bad)
                + f"; {outcome} (fix the problems above, or pass --no-check)")


def preflight_failure(report: DoctorReport | None, job_started: bool) -> PreflightFailure:
    """The failing hosts of a pre-flight's report, as the run's outcome names them."""
    if report is None:
        return PreflightFailure((), job_started)
    return PreflightFailure(tuple(
        (host, report.label(check.name)) for host, check in report.failures()), job_started)


def left_out_reason(report: DoctorReport | None, host: str | None = None) -> str:
    """Why elastic mode left a host out (`host`'s failures; None: all), in its one line (no
    report is printed above it): each failed check with what it found and its fix, so a
    changed host key reads as the possible man-in-the-middle it is, not as any ssh failure."""
    if report is None:
        return "its pre-flight checks failed"
    parts = [f"{report.label(c.name)} check failed: {c.detail}" + (f" ({c.hint})" if c.hint else "")
             for where, c in report.failures() if host is None or where == host]
    return "; ".join(parts) or "its pre-flight checks failed"


def run_preflight(request: RunRequest, plan: RunPlan, job_started: bool = False, *,
                  reach: Reach, use_cache: bool = True,
                  command_timeout: float | None = None,
                  progress: Callable[[int, int, str], None] | None = None) -> PreflightOutcome:
    """Check what the job needs on every host.

    On a cache hit the host keys still get checked: if the job fails, when that is safe (the
    returned `keys`), else here, before the launch. ``job_started``: that check found a bad
    key after the launch; the cache is dropped and the full checks run to report it. ``reach``:
    how hosts are reached (dtlaunch.probe.reach_for, decided once by the caller). ``use_cache`` False
    (`--disable-cache`): always the full checks; ``command_timeout`` (`--start-timeout`):
    seconds each host's checks may run; ``progress(done, total, host)``: told as hosts answer.
    """
    from dtlaunch.check.gpus import slots_pending
    from dtlaunch.check.network import choice_from_json

    hosts = tuple(h.name for h in plan.hosts)
    cwd = os.getcwd()
    use_cache = (use_cache and not job_started
                 and os.environ.get("DTLAUNCH_PREFLIGHT_CACHE", "1") != "0")
    # This machine's MPI launcher as the job will start it, as an absolute path (links kept:
    # a venv's bin/ is the prefix, not where its files point).
    found = shutil.which(plan.family.launcher)
    mpirun = os.path.abspath(found) if found else ""
    # The ranks look a bare program name up on the PATH they get; so do the checks.
    job_path = next((v.value for v in plan.env.variables if v.name == "PATH"), "")
    key = cache_key(request, hosts, cwd, mpirun, job_path)
    warnings: list[str] = []
    problem = cache_problem() if use_cache else None
    if problem is not None:
        use_cache = False
        warnings.append(f"pre-flight cache not used: {problem}")
    entry = cached_entry(key) if use_cache else None
    gpus = gpus_from_json(entry.get("gpus")) if entry is not None else None
    if entry is not None and gpus is None and slots_pending(request.hosts):
        entry = None  # written before GPUs were cached: the slots need the full checks
    network = None
    if entry is not None and entry.get("network") is not None:
        network = choice_from_json(entry["network"])
        if network is None:
            entry = None  # damaged: check again (and write it anew), never run without a network
    if entry is not None:
        if may_overlap(request, plan.family, plan.launcher_env, mpirun):
            return PreflightOutcome(keys=DeferredKeyCheck(hosts, reach.prober), network=network,
                                    message=("pre-flight: passed recently (cached); ssh "
                                             "checks the host keys as the job starts"), gpus=gpus)
        if not host_key_failures(hosts, reach.prober()):
            return PreflightOutcome(network=network, message=(
                "pre-flight: passed recently (cached); host keys verified"), gpus=gpus)
    if entry is not None or job_started:  # a host key failed, or the job found one that did
        drop_cache(key)
    # The checks themselves: imported only now, a cache hit never needs them (~15 ms).
    from dtlaunch.check.host_checks import Expectations
    from dtlaunch.check.network import choice_to_json
    from dtlaunch.doctor.doctor import COMMAND_TIMEOUT, DoctorRequest, run_doctor
    from dtlaunch.job.command import EXECUTABLE

    python, script, module = checked_program(request)
    # The executable the command starts when it is not the interpreter (`bash run.sh`).
    program = request.program
    executable = program.argv[0] if program is not None and program.form == EXECUTABLE else None
    needs = plan.family.needs  # what the way the job starts needs on every host
    expect = Expectations(python or request.python, os.path.abspath(script) if script else None,
                          module, request.iface, pairwise=request.tree_spawn,
                          check_python=python is not None,
                          program=executable, needs=needs)
    doctor_request = DoctorRequest(
        hosts, expect, request.ssh, cwd,
        command_timeout if command_timeout is not None else COMMAND_TIMEOUT,
        mpi_launcher=mpirun if needs.mpi else "", job_path=job_path)
    report, network = run_doctor(doctor_request, progress, reach=reach)
    warnings += report.warning_lines(said=problem)
    if not report.ok:
        return PreflightOutcome(report, warnings=tuple(warnings))
    gpus = {h.host: h.gpus.count for h in report.hosts if h.gpus is not None}
    if use_cache:
        write_cache(key, choice_to_json(network) if network is not None else None, gpus)
    return PreflightOutcome(report, network=network, warnings=tuple(warnings), message=(
        f"pre-flight: {len(report.hosts)} host(s) ready ({report.seconds:.2f} s)"), gpus=gpus)


def gpus_from_json(value: Any) -> dict[str, int] | None:
    """The GPU counts a cache entry holds; anything else (an older entry) is not known."""
    if not isinstance(value, dict):
        return None
    counts = {str(k): v for k, v in value.items() if isinstance(v, int) and v >= 0}
    return counts if len(counts) == len(value) else None


def elastic_survivors(request: RunRequest, report: DoctorReport | None,
                      ) -> tuple[RunRequest, dict[str, str]] | None:
    """An elastic job's first hosts without those whose pre-flight failed, and why each was
    left out, when the others still have the slots it starts with (as discovery leaves a
    failing host out mid-job); None when the job cannot start: not elastic, this machine or
    the job as a whole failed, or too few slots are left."""
    from dtlaunch.check.report import FAIL

    spec = request.elastic
    if spec is None or report is None or any(c.status == FAIL for c in report.job):
        return None
    names = {h.name for h in request.hosts}
    failing = {host for host, _ in report.failures()}
    if not failing or not failing <= names:
        return None
    kept = tuple(h for h in request.hosts if h.name not in failing)
    slots = sum(h.slots for h in kept)
    if slots < spec.start_np:
        return None
    num_proc = min(slots, spec.max_np) if spec.max_np is not None else slots
    return (replace(request, hosts=kept, num_proc=num_proc),
            {host: left_out_reason(report, host) for host in sorted(failing)})
