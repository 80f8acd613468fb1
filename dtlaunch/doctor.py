"""Check every host at once: one SSH connection and one remote command per host, in parallel.

The fan-out uses one daemon thread per host (bounded), so the whole check costs about as much as
the slowest host plus CPU, and Ctrl-C returns at once: open proxies are ended, transports closed.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dtlaunch.checks import (
    HOST,
    LAUNCHER,
    DoctorReport,
    Expectations,
    HostOutcome,
    SshProblem,
    evaluate,
)
from dtlaunch.probe import ProbeArgs, build_remote_command, probe_local
from dtlaunch.ssh_options import SshOptions

MAX_PARALLEL = 64
LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "localhost.localdomain"})

Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class DoctorRequest:
    hosts: tuple[str, ...]  # rank hosts as given; empty: this machine only
    expect: Expectations
    ssh: SshOptions = field(default_factory=SshOptions)
    cwd: str = ""
    command_timeout: float = 150.0  # a cold probe imports torch once per host


def local_names() -> frozenset[str]:
    name = socket.gethostname()
    return LOCAL_NAMES | {name, name.split(".")[0]}


def probe_args(request: DoctorRequest, host: str | None) -> ProbeArgs:
    remote_hosts = [h for h in request.hosts if h not in local_names()]
    peers = tuple(h for h in remote_hosts if h != host) if request.expect.pairwise and host else ()
    return ProbeArgs(
        python=request.expect.python,
        script=request.expect.script,
        module=request.expect.module,
        cwd=request.cwd,
        peers=peers,
        peer_ssh_args=request.ssh.ssh_args() if peers else (),
    )


def probe_remote(host: str, request: DoctorRequest, config: object,
                 live: set[object], lock: threading.Lock) -> HostOutcome:
    from dtlaunch.facts import parse_probe_output
    from dtlaunch.ssh import SshFailure, connect, resolve_target

    start = time.monotonic()
    try:
        target = resolve_target(host, request.ssh, config)
        conn = connect(target)
        with lock:
            live.add(conn)
        try:
            result = conn.run_remote(build_remote_command(probe_args(request, host)),
                                     request.command_timeout)
        finally:
            with lock:
                live.discard(conn)
            conn.close()
        facts = parse_probe_output(result.stdout)
        if not facts.hostname and result.exit_code != 0:
            tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
            return HostOutcome(host, HOST, problem=SshProblem(
                "remote-shell", f"the remote command failed (exit {result.exit_code}): {tail}",
                "the login shell must be POSIX-like (sh, bash, zsh); try "
                f"'ssh {host} sh -c true'"), seconds=time.monotonic() - start)
        return HostOutcome(host, HOST, facts, seconds=time.monotonic() - start,
                           note=conn.host_key_note)
    except SshFailure as exc:
        return HostOutcome(host, HOST, problem=SshProblem(exc.kind, exc.detail, exc.hint),
                           seconds=time.monotonic() - start)
    except Exception as exc:  # a bug or an odd server must not hide the other hosts' results
        return HostOutcome(host, HOST, problem=SshProblem(
            "ssh-error", f"{type(exc).__name__}: {exc}", f"try 'ssh -v {host} true'"),
            seconds=time.monotonic() - start)


def _probe_launcher(request: DoctorRequest, name: str, rank: bool) -> HostOutcome:
    start = time.monotonic()
    try:
        facts = probe_local(probe_args(request, None), timeout=request.command_timeout)
    except Exception as exc:
        return HostOutcome(name, LAUNCHER, problem=SshProblem(
            "local", f"the local probe failed: {exc}", "check that 'sh' and the Python work"),
            seconds=time.monotonic() - start, is_rank_host=rank)
    return HostOutcome(name, LAUNCHER, facts, seconds=time.monotonic() - start, is_rank_host=rank)


def run_doctor(request: DoctorRequest, progress: Progress | None = None,
               while_waiting: Callable[[], None] | None = None) -> DoctorReport:
    """Probe every host in parallel. `while_waiting` runs once on this thread after every probe
    has started (e.g. importing the renderer while the hosts answer)."""
    start = time.monotonic()
    here = local_names()
    local_in_list = [h for h in request.hosts if h in here]
    remote = [h for h in request.hosts if h not in here]
    launcher_name = local_in_list[0] if local_in_list else "localhost"
    rank_launcher = bool(local_in_list) or not request.hosts
    total = len(remote) + 1
    results: queue.Queue[HostOutcome] = queue.Queue()
    live: set[object] = set()
    lock = threading.Lock()

    def launch(job: Callable[[], HostOutcome], slots: threading.Semaphore) -> None:
        def body() -> None:
            with slots:
                try:
                    results.put(job())
                except BaseException as exc:  # always report, or the waiter would wait forever
                    problem = SshProblem("ssh-error", str(exc), "")
                    results.put(HostOutcome("?", HOST, problem=problem))
        threading.Thread(target=body, daemon=True).start()

    slots = threading.Semaphore(MAX_PARALLEL)
    launch(lambda: _probe_launcher(request, launcher_name, rank_launcher), threading.Semaphore(1))
    if remote:
        from dtlaunch.ssh import load_ssh_config

        config = load_ssh_config(request.ssh.config_file)
        for host in remote:
            launch(lambda h=host: probe_remote(h, request, config, live, lock), slots)  # type: ignore[misc]
    outcomes: dict[str, HostOutcome] = {}
    try:
        if while_waiting is not None:
            with contextlib.suppress(Exception):
                while_waiting()
        while len(outcomes) < total:
            try:
                outcome = results.get(timeout=0.1)
            except queue.Empty:
                continue
            outcomes[outcome.host if outcome.host != "?" else f"?{len(outcomes)}"] = outcome
            if progress is not None:
                progress(len(outcomes), total, outcome.host)
    except BaseException:
        _close_all(live, lock)
        raise
    ordered = [outcomes[launcher_name]] + [outcomes[h] for h in remote if h in outcomes]
    ordered += [o for k, o in outcomes.items() if k.startswith("?")]
    return evaluate(ordered, request.expect, time.monotonic() - start,
                    peers=remote if request.expect.pairwise else ())


def _close_all(live: set[object], lock: threading.Lock) -> None:
    from dtlaunch.ssh import close_all_proxies

    with lock:
        conns = list(live)
        live.clear()
    for conn in conns:
        with contextlib.suppress(Exception):
            conn.close()  # type: ignore[attr-defined]
    close_all_proxies()


def build_expectations(python: str, script: str | None, module: str | None,
                       iface: object, pairwise: bool) -> Expectations:
    from dtlaunch.mpi import Interfaces

    return Expectations(
        python=python,
        script=os.path.abspath(script) if script else None,
        module=module,
        iface=iface if isinstance(iface, Interfaces) else None,
        pairwise=pairwise,
    )


def hosts_of(names: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))
