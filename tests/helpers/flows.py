"""A fake world of hosts behind a fake Prober, their facts and a recording job: doctor, the
pre-flight and a whole run, in process."""

from __future__ import annotations

import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from dtlaunch.check.facts import HostFacts, Iface
from dtlaunch.check.report import HOST, CheckResult, HostOutcome
from dtlaunch.core.tracker import Tracker
from dtlaunch.job.hosts import Host
from dtlaunch.plan.plan import RunRequest
from dtlaunch.probe.command import ProbeArgs
from dtlaunch.probe.prober import Reach
from dtlaunch.reach.ssh_options import SshOptions
from dtlaunch.run.execute import LaunchResult
from helpers.facts import host_facts, python_facts

PY = python_facts(executable=sys.executable)


SCRIPT = str(Path(__file__).resolve())


def facts(name: str) -> HostFacts:
    return host_facts(name, ifaces=(Iface("eth0", True, ("10.1.2.3/24",)),), python=PY,
                      program_path="/job/train")


class FakeProber:
    """Hosts as a test wants them: facts, a failed ssh check, or no answer at all."""

    def __init__(self, world: FakeWorld) -> None:
        self.world = world
        self.connect_timeout = 0.2
        world.probers.append(self)
        self.closed = False

    def probe(self, host: str, args: ProbeArgs, timeout: float) -> HostOutcome:
        self.world.probed.append(host)
        if host in self.world.silent:
            self.world.release.wait(600)
        answer = self.world.hosts[host]
        if isinstance(answer, CheckResult):
            return HostOutcome(host, HOST, problem=answer)
        return HostOutcome(host, HOST, answer)

    def prepare(self) -> None:
        self.world.prepared += 1

    def verify(self, host: str) -> str | None:
        self.world.verified.append(host)
        return self.world.keys.get(host)

    def close(self) -> None:
        self.closed = True


class FakeWorld:
    def __init__(self, **hosts: HostFacts | CheckResult) -> None:
        self.hosts: dict[str, HostFacts | CheckResult] = hosts
        self.keys: dict[str, str | None] = {}
        self.silent: set[str] = set()
        self.release = threading.Event()
        self.probed: list[str] = []
        self.verified: list[str] = []
        self.prepared = 0
        self.probers: list[FakeProber] = []

    def here(self, args: ProbeArgs, timeout: float, tracker: Tracker) -> HostFacts:
        return facts("launcher")

    def reach(self) -> Reach:
        return Reach(prober=lambda: FakeProber(self), here=self.here)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("DTLAUNCH_PREFLIGHT_CACHE", raising=False)
    return tmp_path


def run_request(**kw: Any) -> RunRequest:
    base: dict[str, Any] = dict(hosts=(Host("h1"), Host("h2")), python=sys.executable,
                                script=SCRIPT, ssh=SshOptions(connect_timeout=1))
    base.update(kw)
    return RunRequest(**base)


needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")


class RecordingJob:
    def __init__(self) -> None:
        self.argv: list[tuple[str, ...]] = []

    def __call__(self, argv: Any, env: Any, rank_hosts: Any, **kw: Any) -> LaunchResult:
        self.argv.append(tuple(argv))
        return LaunchResult(0, None)
