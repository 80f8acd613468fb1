"""`dtlaunch run`'s pre-flight: the doctor's checks for exactly what the job needs.

A launch is refused on any failure; the caller shows the same table and fixes as `dtlaunch doctor`.

To keep the pre-flight cheap, a successful result is remembered for five minutes in
`~/.cache/dtlaunch/preflight-<key>.json` (directory 0700, file 0600, owned by the user, written
and read without following links: dtlaunch.private_files). A directory that is not private is
not used, with one warning; a file that is not exactly what was written counts as absent. The
key covers the hosts, interpreter, script or module, interfaces, SSH options and working
directory, plus the size and mtime of the ssh config, known_hosts files, the script and the
interpreter, so editing any of them starts over. A cache hit still performs
the SSH key exchange with every host and checks its host key against known_hosts, so a changed
host key is never hidden by the cache: it drops the cache and runs the full checks, which fail.
That key check runs while mpirun starts (see HostKeyWatch for why this is safe), so a cache hit
costs the launch almost nothing. Set DTLAUNCH_PREFLIGHT_CACHE=0 to always run the full checks.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from dtlaunch.openmpi import OPEN_MPI
from dtlaunch.private_files import (
    NotPrivate,
    cache_dir,
    private_dir,
    read_private,
    remove_private,
    write_private,
)
from dtlaunch.prober import Prober, Reach, fan_out, local_names, ssh_reach

if TYPE_CHECKING:
    from dtlaunch.mpi import MpiFamily
    from dtlaunch.network import NetworkChoice
    from dtlaunch.plan import RunPlan, RunRequest
    from dtlaunch.report import DoctorReport

CACHE_SECONDS = 300.0


def _stamp(path: str | None) -> list[Any]:
    if not path:
        return [None]
    try:
        st = os.stat(os.path.expanduser(path))
    except OSError:
        return [path, None]
    return [path, st.st_size, st.st_mtime_ns, st.st_ino]


def checked_program(request: RunRequest) -> tuple[str | None, str | None, str | None]:
    """The interpreter (None: the command names none), script and module the checks look at."""
    program = request.program
    if program is None:
        return request.python, request.script, request.module
    return program.python, program.script, program.module


def cache_key(request: RunRequest, hosts: tuple[str, ...], cwd: str, launcher: str = "") -> str:
    ssh = request.ssh
    python, script, module = checked_program(request)
    watched = [ssh.config_file or "~/.ssh/config", ssh.identity_file, "~/.ssh/known_hosts",
               "~/.ssh/known_hosts2", "/etc/ssh/ssh_known_hosts", script, python, launcher or None]
    material = {
        "version": 2,
        "hosts": hosts,
        "python": python,
        "script": os.path.abspath(script) if script else None,
        "module": module,
        "program": list(request.program.argv) if request.program else None,
        "iface": [list(request.iface.names), list(request.iface.cidrs)] if request.iface else None,
        "ssh": [ssh.port, ssh.identity_file, ssh.config_file, ssh.host_key_policy],
        "tree_spawn": request.tree_spawn,
        "cwd": cwd,
        "launcher": launcher,  # another MPI first on PATH is another job
        "uid": os.getuid(),
        "files": [_stamp(p) for p in watched],
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def _cache_dir() -> str:
    return cache_dir()


def _cache_name(key: str) -> str:
    return f"preflight-{key[:40]}.json"


def _cache_path(key: str) -> str:
    return os.path.join(_cache_dir(), _cache_name(key))


def cache_problem() -> str | None:
    """Why the cache directory cannot be used (created 0700 when missing), or None."""
    try:
        with private_dir(_cache_dir()):
            return None
    except NotPrivate as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot create {_cache_dir()}: {exc.strerror or exc}"


def read_cache(key: str, now: float | None = None) -> bool:
    return cached_entry(key, now) is not None


def cached_entry(key: str, now: float | None = None) -> dict[str, Any] | None:
    """The fresh cache entry for `key` (with the network chosen then), or None: anything
    unreadable, not private or not what write_cache wrote counts as no entry."""
    try:
        with private_dir(_cache_dir(), create=False) as folder:
            raw = read_private(folder, _cache_name(key))
    except (OSError, NotPrivate):
        return None
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        written = float(data["time"]) if data["key"] == key else math.nan
    except (ValueError, KeyError, TypeError, IndexError):
        return None  # not what we wrote: check again (and write it anew)
    age = (now if now is not None else time.time()) - written
    return data if 0 <= age < CACHE_SECONDS and isinstance(data, dict) else None


def write_cache(key: str, network: dict[str, Any] | None = None,
                gpus: dict[str, int] | None = None) -> None:
    data = json.dumps({"key": key, "time": time.time(), "network": network,
                       "gpus": gpus}).encode()
    try:
        with private_dir(_cache_dir()) as folder:
            write_private(folder, _cache_name(key), data)
    except (OSError, NotPrivate):
        pass  # no cache is only slower (run_preflight has said why)


def drop_cache(key: str) -> None:
    try:
        with private_dir(_cache_dir(), create=False) as folder:
            remove_private(folder, _cache_name(key))
    except (OSError, NotPrivate):
        pass


def host_key_failures(hosts: tuple[str, ...], prober: Prober) -> dict[str, str]:
    """The prober's cheap check (SSH: key exchange, no login) on every remote host in
    parallel. Returns host -> failure kind for each host that failed or did not answer."""
    remote = [h for h in hosts if h not in local_names()]
    if not remote:
        return {}

    def fallback(host: str, exc: BaseException | None) -> str | None:
        return "timeout" if exc is None else "error"  # any crash counts as a failure

    try:
        kinds = fan_out(remote, prober.verify, fallback, prober.connect_timeout + 1)
    finally:
        prober.close()
    return {host: kind for host, kind in zip(remote, kinds) if kind is not None}


class HostKeyWatch:
    """A cache hit's host-key check, run while mpirun starts instead of before it.

    This is safe because mpirun's own ssh runs with BatchMode and StrictHostKeyChecking=yes
    (or accept-new when asked): OpenSSH itself refuses to log in to a host whose key is unknown
    or changed, so nothing ever runs on such a host. The watch makes the failure quick and
    clear: it stops the rest of the job, and the caller then re-runs the full checks, whose
    report names the host and the fix. Other failures (a host that does not answer) are left
    to mpirun's ssh, which meets the same fault and reports it.
    """

    def __init__(self, hosts: tuple[str, ...], prober: Prober) -> None:
        self._prober = prober
        self.bad: list[str] = []
        self.done = threading.Event()
        threading.Thread(target=self._run, args=(hosts,), daemon=True).start()

    def _run(self, hosts: tuple[str, ...]) -> None:
        from dtlaunch.ssh_errors import CHANGED_HOST_KEY, UNKNOWN_HOST_KEY

        try:
            failures = host_key_failures(hosts, self._prober)
            self.bad = sorted(h for h, kind in failures.items()
                              if kind in (CHANGED_HOST_KEY, UNKNOWN_HOST_KEY))
        finally:
            self.done.set()

    def stop_reason(self) -> str | None:
        """Polled by the launcher: a reason to stop the job, once one is known."""
        if self.done.is_set() and self.bad:
            return f"host key check failed for {', '.join(self.bad)}: stopping the job"
        return None

    def stop(self) -> None:
        """The job was stopped (a signal): end the check now, with its connections and
        proxies, instead of waiting out a slow handshake."""
        self._prober.close()

    def failed(self) -> bool:
        """Waits for the check (bounded by the connect timeout); True if a key was bad."""
        self.done.wait(self._prober.connect_timeout + 2)
        return bool(self.bad)


def may_overlap(request: RunRequest, family: MpiFamily = OPEN_MPI,
                launcher_env: Mapping[str, str] | None = None) -> bool:
    """The key check may run alongside the launch only while dtlaunch controls the launcher's
    ssh: extra launcher arguments or MCA variables could weaken its host-key checking."""
    env = os.environ if launcher_env is None else launcher_env
    return family.ssh_left_to_dtlaunch(request.mpi_args, env)


@dataclass(frozen=True)
class PreflightOutcome:
    """What the pre-flight found: the full checks' report, or a cache hit (report None)."""

    report: DoctorReport | None = None
    watch: HostKeyWatch | None = None  # a cache hit's key check, running alongside the launch
    network: NetworkChoice | None = None  # the network chosen for a run without --iface
    message: str = ""  # what happened, for --verbose
    gpus: dict[str, int] | None = None  # NVIDIA GPUs per host (None: not known)
    warnings: tuple[str, ...] = ()  # one line each (a cache that could not be used)

    @property
    def ok(self) -> bool:
        return self.report is None or self.report.ok


def failure_message(report: DoctorReport | None, job_started: bool) -> str:
    """The one line that ends a run whose pre-flight failed."""
    bad = sorted({f"{host} ({check.name})" for host, check in report.failures()}) if report else []
    outcome = "the job was stopped" if job_started else "not launching"
    return ("pre-flight checks failed: " + ", ".join(bad)
            + f"; {outcome} (fix the problems above, or pass --no-check)")


def run_preflight(request: RunRequest, plan: RunPlan, job_started: bool = False,
                  reach: Reach | None = None, use_cache: bool = True,
                  command_timeout: float | None = None) -> PreflightOutcome:
    """Check what the job needs on every host.

    On a cache hit the host keys still get checked: alongside mpirun when that is safe (the
    returned watch), else here, before the launch. ``job_started``: the watch found a bad key
    after the launch; the cache is dropped and the full checks run to report it. ``reach``:
    how hosts are reached (default: SSH with the request's options). ``use_cache`` False
    (`--disable-cache`): always the full checks; ``command_timeout`` (`--start-timeout`):
    seconds each host's checks may run.
    """
    ways = reach or ssh_reach(request.ssh)
    from dtlaunch.doctor import (
        COMMAND_TIMEOUT,
        DoctorRequest,
        build_expectations,
        doctor_and_network,
        local_launcher,
    )
    from dtlaunch.gpus import slots_pending
    from dtlaunch.network import choice_from_json, choice_to_json

    hosts = tuple(h.name for h in plan.hosts)
    cwd = os.getcwd()
    use_cache = (use_cache and not job_started
                 and os.environ.get("DTLAUNCH_PREFLIGHT_CACHE", "1") != "0")
    launcher = local_launcher(plan.family.launcher)
    key = cache_key(request, hosts, cwd, launcher)
    warnings: list[str] = []
    problem = cache_problem() if use_cache else None
    if problem is not None:
        use_cache = False
        warnings.append(f"pre-flight cache not used: {problem}")
    entry = cached_entry(key) if use_cache else None
    if entry is not None and gpus_from_json(entry.get("gpus")) is None and slots_pending(
            request.hosts):
        entry = None  # written before GPUs were cached: the slots need the full checks
    network = None
    if entry is not None and entry.get("network") is not None:
        network = choice_from_json(entry["network"])
        if network is None:
            entry = None  # damaged: check again (and write it anew), never run without a network
    if entry is not None:
        gpus = gpus_from_json(entry.get("gpus"))
        if may_overlap(request, plan.family, plan.launcher_env):
            return PreflightOutcome(watch=HostKeyWatch(hosts, ways.prober()), network=network,
                                    message=("pre-flight: passed recently (cached); checking "
                                             "host keys while the job starts"), gpus=gpus)
        if not host_key_failures(hosts, ways.prober()):
            return PreflightOutcome(network=network, message=(
                "pre-flight: passed recently (cached); host keys verified"), gpus=gpus)
        drop_cache(key)
    if job_started:
        drop_cache(key)
    python, script, module = checked_program(request)
    expect = build_expectations(python or request.python, script, module, request.iface,
                                pairwise=request.tree_spawn)
    doctor_request = DoctorRequest(
        hosts=hosts,
        expect=replace(expect, check_python=python is not None),
        ssh=request.ssh,
        cwd=cwd,
        command_timeout=command_timeout if command_timeout is not None else COMMAND_TIMEOUT,
        choose_network=request.iface is None and len(hosts) > 1,
        mpi_launcher=launcher,
    )
    report, network = doctor_and_network(doctor_request, reach=ways)
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
