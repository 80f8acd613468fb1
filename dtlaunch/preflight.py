"""`dtlaunch run`'s pre-flight: the doctor's checks for exactly what the job needs.

A launch is refused on any failure; the caller shows the same table and fixes as `dtlaunch doctor`.

To keep the pre-flight cheap, a successful result is remembered for five minutes in
`~/.cache/dtlaunch/preflight-<key>.json` (directory 0700, file 0600, owned by the user; anything
else is ignored). The key covers the hosts, interpreter, script or module, interfaces, SSH
options and working directory, plus the size and mtime of the ssh config, known_hosts files,
the script and the interpreter, so editing any of them starts over. A cache hit still performs
the SSH key exchange with every host and checks its host key against known_hosts, so a changed
host key is never hidden by the cache: it drops the cache and runs the full checks, which fail.
That key check runs while mpirun starts (see HostKeyWatch for why this is safe), so a cache hit
costs the launch almost nothing. Set DTLAUNCH_PREFLIGHT_CACHE=0 to always run the full checks.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import stat
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from dtlaunch.openmpi import OPEN_MPI
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
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dtlaunch")


def _cache_path(key: str) -> str:
    return os.path.join(_cache_dir(), f"preflight-{key[:40]}.json")


def _private(path: str, kind: int) -> bool:
    """Only our own file or directory (not a link), writable by nobody else, counts."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_IFMT(st.st_mode) == kind and st.st_uid == os.getuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def read_cache(key: str, now: float | None = None) -> bool:
    return cached_entry(key, now) is not None


def cached_entry(key: str, now: float | None = None) -> dict[str, Any] | None:
    """The fresh cache entry for `key` (with the network chosen then), or None."""
    path = _cache_path(key)
    if not _private(path, stat.S_IFREG) or not _private(os.path.dirname(path), stat.S_IFDIR):
        return None
    try:
        with open(path) as handle:
            data = json.load(handle)
        written = float(data["time"]) if data["key"] == key else math.nan
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None  # unreadable or not what we wrote: check again
    age = (now if now is not None else time.time()) - written
    return data if 0 <= age < CACHE_SECONDS and isinstance(data, dict) else None


def write_cache(key: str, network: dict[str, Any] | None = None) -> None:
    folder = _cache_dir()
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if not _private(folder, stat.S_IFDIR):
            return
        path = _cache_path(key)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump({"key": key, "time": time.time(), "network": network}, handle)
        os.replace(tmp, path)
    except OSError:
        pass  # no cache is only slower


def drop_cache(key: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(_cache_path(key))


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

    def failed(self) -> bool:
        """Waits for the check (bounded by the connect timeout); True if a key was bad."""
        self.done.wait(self._prober.connect_timeout + 2)
        return bool(self.bad)


def may_overlap(request: RunRequest, family: MpiFamily = OPEN_MPI) -> bool:
    """The key check may run alongside the launch only while dtlaunch controls the launcher's
    ssh: extra launcher arguments could weaken its host-key checking."""
    return family.ssh_left_to_dtlaunch(request.mpi_args)


@dataclass(frozen=True)
class PreflightOutcome:
    """What the pre-flight found: the full checks' report, or a cache hit (report None)."""

    report: DoctorReport | None = None
    watch: HostKeyWatch | None = None  # a cache hit's key check, running alongside the launch
    network: NetworkChoice | None = None  # the network chosen for a run without --iface
    message: str = ""  # what happened, for --verbose

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
    from dtlaunch.network import choice_from_json, choice_to_json

    hosts = tuple(h.name for h in plan.hosts)
    cwd = os.getcwd()
    use_cache = (use_cache and not job_started
                 and os.environ.get("DTLAUNCH_PREFLIGHT_CACHE", "1") != "0")
    launcher = local_launcher(plan.family.launcher)
    key = cache_key(request, hosts, cwd, launcher)
    entry = cached_entry(key) if use_cache else None
    if entry is not None:
        network = choice_from_json(entry.get("network")) if entry.get("network") else None
        if may_overlap(request, plan.family):
            return PreflightOutcome(watch=HostKeyWatch(hosts, ways.prober()), network=network,
                                    message=("pre-flight: passed recently (cached); checking "
                                             "host keys while the job starts"))
        if not host_key_failures(hosts, ways.prober()):
            return PreflightOutcome(network=network, message=(
                "pre-flight: passed recently (cached); host keys verified"))
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
    if not report.ok:
        return PreflightOutcome(report)
    if use_cache:
        write_cache(key, choice_to_json(network) if network is not None else None)
    return PreflightOutcome(report, network=network, message=(
        f"pre-flight: {len(report.hosts)} host(s) ready ({report.seconds:.2f} s)"))
