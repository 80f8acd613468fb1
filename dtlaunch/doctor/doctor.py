"""Check every host at once: one probe per host through a Prober (SSH by default), in parallel.

The whole check costs about as much as the slowest host plus CPU and never more than one
overall deadline; Ctrl-C returns at once, and the prober ends whatever it still holds open.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from dtlaunch.check.host_checks import Expectations
from dtlaunch.check.network import NetworkChoice, check_network, choose_from_outcomes
from dtlaunch.check.report import HOST, LOCAL, DoctorReport, HostOutcome, unreachable
from dtlaunch.check.verdict import evaluate
from dtlaunch.core.tracker import Tracker
from dtlaunch.probe.command import ProbeArgs
from dtlaunch.probe.prober import Reach, fan_out, local_names
from dtlaunch.reach.ssh_options import SshOptions

Progress = Callable[[int, int, str], None]
COMMAND_TIMEOUT = 150.0  # seconds a host's checks may run: a cold probe imports torch once


@dataclass(frozen=True)
class DoctorRequest:
    hosts: tuple[str, ...]  # rank hosts as given; empty: this machine only
    expect: Expectations
    ssh: SshOptions = field(default_factory=SshOptions)
    cwd: str = ""
    command_timeout: float = COMMAND_TIMEOUT
    mpi_launcher: str = ""  # for ProbeArgs.mpi_launcher
    job_path: str = ""  # for ProbeArgs.path: the PATH the job exports to its ranks


def rotated_peers(hosts: list[str], host: str) -> tuple[str, ...]:
    """The other hosts, starting after `host`: every host logs in to its peers a few at a
    time (the probe's batches), and were the lists all in one order, every host would log in
    to the same few hosts at once, past sshd's MaxStartups (default 10 logins in progress)."""
    if host not in hosts:
        return tuple(hosts)
    at = hosts.index(host)
    return tuple(h for h in hosts[at + 1:] + hosts[:at] if h != host)


def probe_args(request: DoctorRequest, host: str | None) -> ProbeArgs:
    remote_hosts = [h for h in request.hosts if h not in local_names()]
    peers = rotated_peers(remote_hosts, host) if request.expect.pairwise and host else ()
    expect = request.expect
    return ProbeArgs(python=expect.python, script=expect.script, module=expect.module,
                     cwd=request.cwd, peers=peers, peer_ssh_args=request.ssh.ssh_args() if peers else (),
                     mpi_launcher=request.mpi_launcher, path=request.job_path,
                     program=expect.program or "")


def run_doctor(request: DoctorRequest, progress: Progress | None = None,
               while_waiting: Callable[[], None] | None = None, *,
               reach: Reach) -> tuple[DoctorReport, NetworkChoice | None]:
    """Probe this machine and every host in parallel, within one overall deadline: the report,
    and the network chosen when the request asks for one. `while_waiting` runs once on this
    thread after every probe has started (e.g. importing the renderer while the hosts answer);
    `reach`: how hosts are reached, decided by the caller (dtlaunch.probe.reach_for)."""
    start = time.monotonic()
    here = local_names()
    local_in_list = [h for h in request.hosts if h in here]
    remote = [h for h in request.hosts if h not in here]
    local_name = local_in_list[0] if local_in_list else "localhost"
    local_is_rank_host = bool(local_in_list) or not request.hosts
    prober = reach.prober()
    here_probe = Tracker()
    # The hosts' threads wait for the prober's imports, made on this thread while this
    # machine's probe (which imports nothing) runs: no two threads import at once.
    prepared = threading.Event()

    def probe_here() -> HostOutcome:
        try:
            facts = reach.here(probe_args(request, None), request.command_timeout, here_probe)
        except Exception as exc:
            return HostOutcome(local_name, LOCAL, problem=unreachable(
                f"the local probe failed: {exc}", "check that 'sh' and the Python work"),
                is_rank_host=local_is_rank_host)
        return HostOutcome(local_name, LOCAL, facts, is_rank_host=local_is_rank_host)

    def work(host: str | None) -> HostOutcome:
        """A host's outcome with the seconds its probe took (a Prober leaves them out)."""
        if host is not None:
            prepared.wait()
        began = time.monotonic()
        outcome = (probe_here() if host is None else
                   prober.probe(host, probe_args(request, host), request.command_timeout))
        return replace(outcome, seconds=time.monotonic() - began)

    def meanwhile() -> None:
        try:
            prober.prepare()
        except Exception:  # each host's probe meets the same error and reports it
            pass
        finally:
            prepared.set()
        if while_waiting is not None:
            while_waiting()

    # A connection may take the connect timeout twice (TCP and SSH handshake, then login).
    seconds = 2 * prober.connect_timeout + request.command_timeout + 5

    def fallback(host: str | None, exc: BaseException | None) -> HostOutcome:
        name = local_name if host is None else host
        problem = (unreachable(f"no answer within {seconds:g} s", f"try 'ssh -v {name} true'")
                   if exc is None else unreachable(f"{type(exc).__name__}: {exc}", ""))
        return HostOutcome(name, LOCAL if host is None else HOST, problem=problem, seconds=seconds)

    def report(done: int, host: str | None) -> None:
        if progress is not None:
            progress(done, len(remote) + 1, local_name if host is None else host)

    hosts: list[str | None] = [None, *remote]
    try:
        outcomes = fan_out(hosts, work, fallback, seconds, report, meanwhile)
    finally:
        prober.close()
        here_probe.close_all()
    judged = evaluate(outcomes, request.expect, time.monotonic() - start,
                      peers=remote if request.expect.pairwise else ())
    # The network the hosts share (dtlaunch.check.network), chosen and reported unless --iface
    # names one or there is one host only.
    choice = None
    if request.expect.iface is None and len(request.hosts) > 1:
        choice = choose_from_outcomes(outcomes)
        if choice is not None:
            judged = replace(judged, job=(check_network(choice), *judged.job))
    return judged, choice

