"""doctor, the run pre-flight and a whole run, in-process against a fake prober (no root, no
sshd): cache miss and hit, the host-key check alongside the launch, a dead host, a changed key.
The test bed (test_doctor_testbed.py) runs the same flows for real."""

from __future__ import annotations

import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dtlaunch import preflight, session
from dtlaunch.checks import Expectations
from dtlaunch.doctor import DoctorRequest, run_doctor
from dtlaunch.facts import HostFacts, Iface, PythonFacts
from dtlaunch.failures import Failure
from dtlaunch.hosts import Host
from dtlaunch.launch import LaunchResult
from dtlaunch.mpi import MpiImpl
from dtlaunch.plan import RunRequest, plan_run
from dtlaunch.probe import ProbeArgs
from dtlaunch.prober import Reach, Tracker
from dtlaunch.report import FAIL, HOST, PASS, CheckResult, HostOutcome, ssh_failed
from dtlaunch.ssh_errors import CHANGED_HOST_KEY
from dtlaunch.ssh_options import SshOptions

PY = PythonFacts(found=True, executable=sys.executable, version="3.11.7",
                 torch_version="2.13.0", horovod_version="0.28.1", torch_imported="2.13.0",
                 horovod_imported="0.28.1", frameworks=("PyTorch",), controllers=("MPI", "Gloo"),
                 tensor_ops=("MPI", "Gloo"), module_found=True)
SCRIPT = str(Path(__file__).resolve())


@pytest.fixture(autouse=True)
def _no_kept_home_note(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's training variables would add a kept-home note to every run's events."""
    import os

    from dtlaunch.envvars import EnvPlan, kept_home

    for name in kept_home(os.environ, EnvPlan(())):
        monkeypatch.delenv(name)



def facts(name: str) -> HostFacts:
    return HostFacts(hostname=name, path="/usr/bin", mpirun="/usr/bin/mpirun",
                     orted="/usr/bin/orted", mpi=MpiImpl("Open MPI", "4.1.4"),
                     ifaces=(Iface("eth0", True, ("10.1.2.3/24",)),), python=PY,
                     script_exists=True)


CHANGED = ssh_failed("the host key of h2 has CHANGED", "POSSIBLE MAN-IN-THE-MIDDLE ATTACK: ...")


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
            self.world.release.wait(60)
        answer = self.world.hosts[host]
        if isinstance(answer, CheckResult):
            return HostOutcome(host, HOST, problem=answer)
        return HostOutcome(host, HOST, answer)

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
        self.probers: list[FakeProber] = []

    def here(self, args: ProbeArgs, timeout: float, tracker: Tracker) -> HostFacts:
        return facts("launcher")

    def reach(self) -> Reach:
        return Reach(prober=lambda: FakeProber(self), here=self.here)


def doctor(world: FakeWorld, *hosts: str, command_timeout: float = 30) -> Any:
    request = DoctorRequest(hosts=hosts, expect=Expectations(python=sys.executable, script=SCRIPT),
                            command_timeout=command_timeout)
    return run_doctor(request, reach=world.reach())


def test_doctor_all_healthy() -> None:
    world = FakeWorld(h1=facts("h1"), h2=facts("h2"))
    report = doctor(world, "h1", "h2")
    assert report.ok
    assert [h.host for h in report.hosts] == ["localhost", "h1", "h2"]
    assert sorted(world.probed) == ["h1", "h2"]
    assert all(p.closed for p in world.probers)
    assert report.hosts[1].check("hostname") == CheckResult("hostname", PASS, "h1")


def test_doctor_dead_host_fails_alone() -> None:
    dead = ssh_failed("connection refused by 10.0.0.2:22", "start sshd there")
    report = doctor(FakeWorld(h1=facts("h1"), h2=dead), "h1", "h2")
    assert not report.ok
    assert [(h, c.name) for h, c in report.failures()] == [("h2", "ssh")]
    h2 = report.hosts[2]
    assert h2.check("ssh") == dead and h2.check("mpirun").status == "skip"  # type: ignore[union-attr]


def test_doctor_returns_by_its_deadline_when_a_host_never_answers() -> None:
    world = FakeWorld(h1=facts("h1"), h2=facts("h2"))
    world.silent.add("h2")
    start = time.monotonic()
    try:
        report = doctor(world, "h1", "h2", command_timeout=0.5)
    finally:
        world.release.set()
    assert time.monotonic() - start < 20
    ssh = report.hosts[2].check("ssh")
    assert ssh is not None and ssh.status == FAIL and "no answer within" in ssh.detail
    assert report.hosts[1].status == PASS
    assert all(p.closed for p in world.probers)  # the stuck host's connection is ended


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


def test_preflight_cache_miss_then_hit_checks_keys_alongside_the_launch(cache: Path) -> None:
    world = FakeWorld(h1=facts("h1"), h2=facts("h2"))
    request = run_request()
    plan = plan_run(request, {"PATH": "/usr/bin"})
    first = preflight.run_preflight(request, plan, reach=world.reach())
    assert first.ok and first.report is not None and first.watch is None
    assert sorted(world.probed) == ["h1", "h2"] and world.verified == []
    second = preflight.run_preflight(request, plan, reach=world.reach())
    assert second.ok and second.report is None and second.watch is not None
    assert "cached" in second.message
    assert not second.watch.failed()  # waits for the key check: every key is fine
    assert sorted(world.verified) == ["h1", "h2"]
    assert sorted(world.probed) == ["h1", "h2"]  # the full checks did not run again


def test_preflight_cache_hit_with_plm_rsh_args_checks_keys_first(cache: Path) -> None:
    world = FakeWorld(h1=facts("h1"), h2=facts("h2"))
    request = run_request(mpi_args=("--mca", "plm_rsh_args", "-o X=y"))
    plan = plan_run(request, {"PATH": "/usr/bin"})
    assert preflight.run_preflight(request, plan, reach=world.reach()).ok
    world.keys["h2"] = CHANGED_HOST_KEY
    world.hosts["h2"] = CHANGED
    again = preflight.run_preflight(request, plan, reach=world.reach())
    assert again.watch is None and not again.ok
    assert world.verified.count("h2") == 1
    assert preflight.failure_message(again.report, job_started=False) == (
        "pre-flight checks failed: h2 (ssh); not launching "
        "(fix the problems above, or pass --no-check)")


needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")


class StoppableJob:
    """Stands in for launch.execute: runs until its stop_when gives a reason."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, argv: Any, env: Any, rank_hosts: Any, **kw: Any) -> LaunchResult:
        self.calls += 1
        stop_when = kw["stop_when"]
        deadline = time.monotonic() + 20
        while stop_when is not None and time.monotonic() < deadline:
            reason = stop_when()
            if reason is not None:
                kw["announce"](reason)
                return LaunchResult(143, Failure(reason=reason))
            time.sleep(0.01)
        return LaunchResult(0, None)


@needs_mpirun
def test_run_whose_host_key_changed_after_a_cached_preflight_is_stopped(cache: Path) -> None:
    world = FakeWorld(h1=facts("h1"), h2=facts("h2"))
    job = StoppableJob()
    launch = session.LaunchRequest(run_request())
    events: list[session.Event] = []
    first = session.launch(launch, events.append, executor=job, reach=world.reach())
    assert first.exit_code == 0 and first.error is None and job.calls == 1
    world.keys["h2"] = CHANGED_HOST_KEY
    world.hosts["h2"] = CHANGED
    second = session.launch(launch, events.append, executor=job, reach=world.reach())
    assert job.calls == 2 and second.result is not None and second.result.exit_code == 143
    assert second.exit_code == 1
    assert second.error == ("pre-flight checks failed: h2 (ssh); the job was stopped "
                            "(fix the problems above, or pass --no-check)")
    assert second.preflight is not None and second.preflight.hosts[2].check("ssh") == CHANGED
    notes = [e.text for e in events if e.level is session.EventLevel.NOTE]
    assert notes == ["host key check failed for h2: stopping the job"]
    # The cache was dropped: the next run checks everything again and refuses to launch.
    third = session.launch(launch, events.append, executor=job, reach=world.reach())
    assert job.calls == 2 and third.result is None and third.exit_code == 1
    assert third.error is not None and "not launching" in third.error


@needs_mpirun
def test_run_with_a_dead_host_launches_nothing(cache: Path) -> None:
    world = FakeWorld(h1=facts("h1"), h2=ssh_failed("no answer from 10.0.0.2:22 within 1 s", "x"))
    job = StoppableJob()
    outcome = session.launch(session.LaunchRequest(run_request()), lambda e: None, executor=job,
                             reach=world.reach())
    assert job.calls == 0 and outcome.result is None and outcome.exit_code == 1
    assert outcome.error is not None and outcome.error.startswith(
        "pre-flight checks failed: h2 (ssh); not launching")
    assert not list(cache.glob("dtlaunch/preflight-*.json"))  # a failure is never cached


