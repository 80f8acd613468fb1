"""doctor, the run pre-flight and a whole run, in-process against a fake prober (no root, no
sshd): cache miss and hit, the host-key check alongside the launch, a dead host, a changed key.
The test bed (test_doctor_testbed.py) runs the same flows for real."""

from __future__ import annotations

import io
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers.flows import (
    PY,
    SCRIPT,
    FakeWorld,
    RecordingJob,
    cache,
    facts,
    needs_mpirun,
    run_request,
)
from helpers.procs import HANG

from dtlaunch.check.facts import HostFacts, Iface, PythonFacts
from dtlaunch.check.host_checks import Expectations
from dtlaunch.check.report import FAIL, PASS, SKIP, CheckResult, unreachable
from dtlaunch.console.render import render_report, report_to_json
from dtlaunch.core.failure import Failure
from dtlaunch.doctor import preflight
from dtlaunch.doctor.doctor import DoctorRequest, run_doctor
from dtlaunch.job.command import parse_command
from dtlaunch.job.hosts import Host
from dtlaunch.mpi import parse_iface
from dtlaunch.openmpi.family import OPEN_MPI
from dtlaunch.plan.plan import plan_run
from dtlaunch.reach.ssh_errors import CHANGED_HOST_KEY
from dtlaunch.reach.ssh_options import SshOptions
from dtlaunch.run import session
from dtlaunch.run.execute import LaunchResult

__all__ = ["cache"]  # the fixture, used by name


@pytest.fixture(autouse=True)
def _no_kept_home_note(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's training variables would add a kept-home note to every run's events."""
    import os

    from dtlaunch.job.env import EnvPlan, kept_home

    for name in kept_home(os.environ, EnvPlan(())):
        monkeypatch.delenv(name)





CHANGED = unreachable("the host key of h2 has CHANGED", "POSSIBLE MAN-IN-THE-MIDDLE ATTACK: ...")






def doctor(world: FakeWorld, *hosts: str, command_timeout: float = 30) -> Any:
    request = DoctorRequest(hosts=hosts, expect=Expectations(python=sys.executable, script=SCRIPT),
                            command_timeout=command_timeout)
    return run_doctor(request, reach=world.reach())[0]


def test_doctor_all_healthy() -> None:
    world = FakeWorld(h1=facts("h1"), h2=facts("h2"))
    report = doctor(world, "h1", "h2")
    assert report.ok
    assert [h.host for h in report.hosts] == ["localhost", "h1", "h2"]
    assert sorted(world.probed) == ["h1", "h2"]
    assert all(p.closed for p in world.probers)
    assert report.hosts[1].check("hostname") == CheckResult("hostname", PASS, "h1")


def test_doctor_calls_the_machine_it_runs_on_this_machine_but_its_json_keeps_launcher() -> None:
    """One word for the machine running dtlaunch: "this machine" in the table and the checks'
    words; `doctor --json` keeps the role value scripts already read ("launcher")."""
    world = FakeWorld(h1=facts("h1"), h2=facts("h2"))
    report = doctor(world, "h1", "h2")
    shown = io.StringIO()
    render_report(report, shown)
    rows = [line for line in shown.getvalue().splitlines() if "│localhost" in line]
    assert len(rows) == 1 and "│localhost (this machine) │" in rows[0], shown.getvalue()
    assert "(launcher)" not in shown.getvalue()
    roles = {h["host"]: h["role"] for h in json.loads(report_to_json(report))["hosts"]}
    assert roles == {"localhost": "launcher", "h1": "host", "h2": "host"}


def test_doctor_dead_host_fails_alone() -> None:
    dead = unreachable("connection refused by 10.0.0.2:22", "start sshd there")
    report = doctor(FakeWorld(h1=facts("h1"), h2=dead), "h1", "h2")
    assert not report.ok
    assert [(h, c.name) for h, c in report.failures()] == [("h2", "reach")]
    h2 = report.hosts[2]
    assert h2.check("reach") == dead and h2.check("mpirun").status == "skip"  # type: ignore[union-attr]


def test_doctor_returns_by_its_deadline_when_a_host_never_answers() -> None:
    world = FakeWorld(h1=facts("h1"), h2=facts("h2"))
    world.silent.add("h2")
    start = time.monotonic()
    try:
        report = doctor(world, "h1", "h2", command_timeout=0.5)
    finally:
        world.release.set()
    assert time.monotonic() - start < HANG  # by its deadline, not the silent host's
    ssh = report.hosts[2].check("reach")
    assert ssh is not None and ssh.status == FAIL and "no answer within" in ssh.detail
    assert report.hosts[1].status == PASS
    assert all(p.closed for p in world.probers)  # the stuck host's connection is ended






def test_preflight_cache_miss_then_hit_leaves_the_keys_to_ssh_until_a_failure(
        cache: Path) -> None:
    world = FakeWorld(h1=facts("h1"), h2=facts("h2"))
    request = run_request()
    plan = plan_run(request, {"PATH": "/usr/bin"}, family=OPEN_MPI)
    first = preflight.run_preflight(request, plan, reach=world.reach())
    assert first.ok and first.report is not None and first.keys is None
    assert sorted(world.probed) == ["h1", "h2"] and world.verified == []
    second = preflight.run_preflight(request, plan, reach=world.reach())
    assert second.ok and second.report is None and second.keys is not None
    assert "cached" in second.message
    assert world.verified == []  # nothing checked before or while the job starts
    assert not second.keys.failed()  # the check a failed job makes: every key is fine
    assert sorted(world.verified) == ["h1", "h2"]
    assert sorted(world.probed) == ["h1", "h2"]  # the full checks did not run again


@pytest.mark.parametrize(("mpi_args", "environ"), [
    (("--mca", "plm_rsh_args", "-o X=y"), {}),
    # Other names for the launch agent, and the launcher's environment, count too.
    (("-mca", "orte_rsh_agent", "ssh -o X=y"), {}),
    (("--prtemca", "plm_ssh_agent", "ssh"), {}),
    ((), {"OMPI_MCA_plm_rsh_agent": "ssh -o X=y"}),
])
def test_preflight_cache_hit_with_an_agent_override_checks_keys_first(
        cache: Path, mpi_args: tuple[str, ...], environ: dict[str, str]) -> None:
    world = FakeWorld(h1=facts("h1"), h2=facts("h2"))
    request = run_request(mpi_args=mpi_args)
    plan = plan_run(request, {"PATH": "/usr/bin", **environ}, family=OPEN_MPI)
    assert preflight.run_preflight(request, plan, reach=world.reach()).ok
    world.keys["h2"] = CHANGED_HOST_KEY
    world.hosts["h2"] = CHANGED
    again = preflight.run_preflight(request, plan, reach=world.reach())
    assert again.keys is None and not again.ok
    assert world.verified.count("h2") == 1
    assert preflight.preflight_failure(again.report, job_started=False).describe() == (
        "pre-flight checks failed: h2 (ssh); not launching "
        "(fix the problems above, or pass --no-check)")
    assert preflight.preflight_failure(again.report, job_started=False).failing == (
        ("h2", "ssh"),)




class SshJob:
    """Stands in for launch.execute as OpenSSH behaves under it: a host whose key the world
    has made bad refuses the login, and the job fails at its start."""

    def __init__(self, world: FakeWorld, result: LaunchResult | None = None) -> None:
        self.world = world
        self.result = result
        self.calls = 0

    def __call__(self, argv: Any, env: Any, rank_hosts: Any, **kw: Any) -> LaunchResult:
        self.calls += 1
        bad = sorted(h for h, kind in self.world.keys.items() if kind is not None)
        if bad:
            return LaunchResult(255, Failure(host=bad[0], reason="ssh refused the host"))
        return self.result or LaunchResult(0, None)


@needs_mpirun
def test_run_whose_host_key_changed_after_a_cached_preflight_names_it(cache: Path) -> None:
    world = FakeWorld(h1=facts("h1"), h2=facts("h2"))
    job = SshJob(world)
    launch = session.LaunchRequest(run_request())
    first = session.launch(launch, lambda e: None, executor=job, reach=world.reach())
    assert first.exit_code == 0 and first.error is None and job.calls == 1
    assert session.launch(launch, lambda e: None, executor=job,
                          reach=world.reach()).exit_code == 0  # a cache hit
    assert world.verified == []  # a job that succeeds pays for no key check
    world.keys["h2"] = CHANGED_HOST_KEY
    world.hosts["h2"] = CHANGED
    second = session.launch(launch, lambda e: None, executor=job, reach=world.reach())
    assert job.calls == 3 and second.result is not None and second.result.exit_code == 255
    assert second.exit_code == 1
    assert second.error == ("pre-flight checks failed: h2 (ssh); the job did not start "
                            "(fix the problems above, or pass --no-check)")
    assert second.preflight is not None and second.preflight.hosts[2].check("reach") == CHANGED
    # The cache was dropped: the next run checks everything again and refuses to launch.
    third = session.launch(launch, lambda e: None, executor=job, reach=world.reach())
    assert job.calls == 3 and third.result is None and third.exit_code == 1
    assert third.error is not None and "not launching" in third.error


@needs_mpirun
@pytest.mark.parametrize("result", [
    LaunchResult(3, Failure(rank=1, host="h2", exit_code=3)),  # checked: keys are fine
    LaunchResult(130, None, interrupted_by=2),  # never checked: the user stopped it
    LaunchResult(124, None, timed_out=True),  # never checked: --timeout
])
def test_a_failed_cached_job_is_reported_as_it_failed(cache: Path, result: LaunchResult) -> None:
    world = FakeWorld(h1=facts("h1"), h2=facts("h2"))
    launch = session.LaunchRequest(run_request())
    assert session.launch(launch, lambda e: None, executor=SshJob(world),
                          reach=world.reach()).exit_code == 0
    outcome = session.launch(launch, lambda e: None, executor=SshJob(world, result),
                             reach=world.reach())
    assert outcome.exit_code == result.exit_code and outcome.preflight is None
    checked = result.interrupted_by is None and not result.timed_out
    assert sorted(world.verified) == (["h1", "h2"] if checked else [])


@needs_mpirun
def test_run_with_a_dead_host_launches_nothing(cache: Path) -> None:
    world = FakeWorld(h1=facts("h1"), h2=unreachable("no answer from 10.0.0.2:22 within 1 s", "x"))
    job = SshJob(world)
    outcome = session.launch(session.LaunchRequest(run_request()), lambda e: None, executor=job,
                             reach=world.reach())
    assert job.calls == 0 and outcome.result is None and outcome.exit_code == 1
    assert outcome.error is not None and outcome.error.startswith(
        "pre-flight checks failed: h2 (ssh); not launching")
    assert not list(cache.glob("dtlaunch/preflight-*.json"))  # a failure is never cached




# --- the network chosen when no --iface is given ------------------------------------------------

def on_net(name: str, address: str, *extra: Iface) -> HostFacts:
    """A host on 10.1.2.0/24 that also carries docker0's 172.17.0.1, like every Docker host."""
    return replace(facts(name), ifaces=(Iface("lo", True, ("127.0.0.1/8",)),
                                        Iface("eth0", True, (f"{address}/24",)),
                                        Iface("docker0", True, ("172.17.0.1/16",)), *extra))




def docker_world() -> FakeWorld:
    world = FakeWorld(h1=on_net("h1", "10.1.2.11"), h2=on_net("h2", "10.1.2.12"))
    world.here = lambda *a: on_net("launcher", "10.1.2.1")  # type: ignore[method-assign]
    return world


@needs_mpirun
def test_run_without_iface_uses_the_shared_network_not_docker0_and_caches_it(cache: Path) -> None:
    world, job = docker_world(), RecordingJob()
    events: list[session.Event] = []
    launch = session.LaunchRequest(run_request())
    first = session.launch(launch, events.append, executor=job, reach=world.reach())
    assert first.exit_code == 0 and first.preflight is None
    argv = job.argv[0]
    assert argv[argv.index("btl_tcp_if_include") + 1] == "10.1.2.0/24"
    assert argv[argv.index("oob_tcp_if_include") + 1] == "10.1.2.0/24"
    assert "NCCL_SOCKET_IFNAME==eth0" in argv and "HOROVOD_GLOO_IFACE=eth0" in argv
    notes = [e.text for e in events if e.level is session.EventLevel.NOTE]
    assert notes[0].startswith("network: 10.1.2.0/24 (h1 eth0, h2 eth0); not used: 172.17.0.0/16")
    # The pre-flight's progress (the two hosts and this machine, each as it answers).
    progress = [e.text for e in events if e.level is session.EventLevel.PROGRESS]
    assert progress == ["hosts checked 1/3", "hosts checked 2/3", "hosts checked 3/3"]
    # A cache hit reuses the choice without probing again.
    events.clear()
    second = session.launch(launch, events.append, executor=job, reach=world.reach())
    assert second.exit_code == 0 and sorted(world.probed) == ["h1", "h2"]
    assert not [e for e in events if e.level is session.EventLevel.PROGRESS]
    assert job.argv[1] == argv
    assert any(e.text.startswith("network: 10.1.2.0/24") for e in events)


@needs_mpirun
def test_iface_and_no_check_choose_nothing(cache: Path) -> None:
    world, job = docker_world(), RecordingJob()
    events: list[session.Event] = []
    for launch in (session.LaunchRequest(run_request(iface=parse_iface("eth0"))),
                   session.LaunchRequest(run_request(), check=False)):
        session.launch(launch, events.append, executor=job, reach=world.reach())
    assert not any(e.text.startswith("network:") for e in events)
    given, unchecked = job.argv
    assert given[given.index("btl_tcp_if_include") + 1] == "eth0"
    assert "btl_tcp_if_include" not in unchecked


@needs_mpirun
def test_no_shared_network_refuses_with_each_hosts_interfaces(cache: Path) -> None:
    world, job = docker_world(), RecordingJob()
    world.hosts["h2"] = on_net("h2", "10.1.2.12", Iface("ib0", True, ("192.168.9.2/24",)))
    world.hosts["h1"] = on_net("h1", "10.1.2.11", Iface("ib0", True, ("192.168.9.1/24",)))
    world.here = lambda *a: on_net(  # type: ignore[method-assign]
        "launcher", "10.1.2.1", Iface("ib0", True, ("192.168.9.254/24",)))
    outcome = session.launch(session.LaunchRequest(run_request(), use_cache=False),
                             lambda e: None, executor=job, reach=world.reach())
    assert job.argv == [] and outcome.exit_code == 1 and outcome.preflight is not None
    assert outcome.error is not None and outcome.error.startswith(
        "pre-flight checks failed: all hosts (network); not launching")
    (_where, check), = outcome.preflight.failures()
    assert check.status == FAIL and "several networks connect every host" in check.detail
    assert "h1: " in check.hint or "h1: " in check.detail
    assert "--iface" in check.hint
    assert not list(cache.glob("dtlaunch/preflight-*.json"))


def test_doctor_shows_the_chosen_network() -> None:
    world = docker_world()
    request = DoctorRequest(hosts=("h1", "h2"), expect=Expectations(python=sys.executable),
                            ssh=SshOptions(connect_timeout=1), command_timeout=30)
    report, _ = run_doctor(request, reach=world.reach())
    assert report.ok and [c.name for c in report.job] == ["network"]
    assert report.job[0].detail.startswith("network: 10.1.2.0/24 (h1 eth0, h2 eth0)")


# --- what the pre-flight checks of each command form ---------------------------------------------

def test_an_executable_without_an_interpreter_skips_the_python_checks(cache: Path) -> None:
    world = FakeWorld(h1=facts("h1"), h2=facts("h2"))
    world.hosts["h2"] = replace(facts("h2"), python=PythonFacts(found=False, error="no such file"))
    program = parse_command(("./train", "--epochs", "1"), python=sys.executable)
    request = run_request(script=None, program=program)
    plan = plan_run(request, {"PATH": "/usr/bin"}, family=OPEN_MPI)
    checked = preflight.run_preflight(request, plan, reach=world.reach())
    assert checked.ok and checked.report is not None
    h2 = next(h for h in checked.report.hosts if h.host == "h2")
    assert h2.check("python") == CheckResult("python", SKIP, "not a Python command")
    # The same host fails once the command names an interpreter.
    program = parse_command(("python", SCRIPT), python=sys.executable)
    request = run_request(script=None, program=program)
    checked = preflight.run_preflight(request, plan_run(request, {"PATH": "/usr/bin"}, family=OPEN_MPI),
                                      reach=world.reach())
    assert not checked.ok
    assert [h for h, c in checked.report.failures()] == ["h2"]  # type: ignore[union-attr]


def test_disable_cache_and_start_timeout(cache: Path) -> None:
    world = FakeWorld(h1=facts("h1"), h2=facts("h2"))
    request = run_request()
    plan = plan_run(request, {"PATH": "/usr/bin"}, family=OPEN_MPI)
    assert preflight.run_preflight(request, plan, reach=world.reach()).ok
    again = preflight.run_preflight(request, plan, reach=world.reach(), use_cache=False)
    assert again.report is not None and world.probed.count("h1") == 2
    world.silent.add("h2")
    start = time.monotonic()
    late = preflight.run_preflight(request, plan, reach=world.reach(), use_cache=False,
                                   command_timeout=1)
    world.release.set()
    assert not late.ok and time.monotonic() - start < HANG


# --- caches that cannot be used are named, once -------------------------------------------------

@needs_mpirun
def test_a_preflight_cache_directory_others_can_write_is_not_used_and_says_so(cache: Path) -> None:
    folder = cache / "dtlaunch"
    folder.mkdir()
    folder.chmod(0o777)
    world, job = FakeWorld(h1=facts("h1"), h2=facts("h2")), RecordingJob()
    events: list[session.Event] = []
    launch = session.LaunchRequest(run_request())
    for _ in range(2):
        assert session.launch(launch, events.append, executor=job,
                              reach=world.reach()).exit_code == 0
    warnings = [e.text for e in events if e.level is session.EventLevel.WARNING]
    assert len(warnings) == 2 and warnings[0] == warnings[1]
    assert warnings[0] == (f"pre-flight cache not used: {folder} is writable by its group or "
                           "others (chmod 700 it)")
    assert list(folder.iterdir()) == []
    assert sorted(world.probed) == ["h1", "h1", "h2", "h2"]  # full checks both times


@needs_mpirun
def test_this_machines_cache_directory_is_named_once_for_both_caches(cache: Path) -> None:
    folder = cache / "dtlaunch"
    folder.mkdir()
    folder.chmod(0o777)
    problem = f"{folder} is writable by its group or others (chmod 700 it)"
    world, job = FakeWorld(h1=facts("h1")), RecordingJob()
    world.here = lambda *a: replace(  # type: ignore[method-assign]
        facts("launcher"), python=replace(PY, import_cache_problem=problem))
    events: list[session.Event] = []
    request = session.LaunchRequest(run_request(hosts=(Host("h1"), Host("localhost"))))
    assert session.launch(request, events.append, executor=job, reach=world.reach()).exit_code == 0
    warnings = [e.text for e in events if e.level is session.EventLevel.WARNING]
    assert warnings == [f"pre-flight cache not used: {problem}"]


@needs_mpirun
def test_a_hosts_import_cache_problem_is_one_warning(cache: Path) -> None:
    problem = "/home/me/.cache/dtlaunch is owned by uid 1000, not by you (uid 0)"
    h2 = replace(facts("h2"), python=replace(PY, import_cache_problem=problem))
    world, job = FakeWorld(h1=facts("h1"), h2=h2), RecordingJob()
    events: list[session.Event] = []
    assert session.launch(session.LaunchRequest(run_request()), events.append, executor=job,
                          reach=world.reach()).exit_code == 0
    warnings = [e.text for e in events if e.level is session.EventLevel.WARNING]
    assert warnings == [f"h2: import cache not used: {problem}"]
    report = doctor(world, "h1", "h2")
    assert report.ok and report.hosts[2].warnings == (f"import cache not used: {problem}",)
    shown = io.StringIO()
    render_report(report, shown)
    assert [line for line in shown.getvalue().splitlines() if "import cache" in line] == [
        f"h2: warning: import cache not used: {problem}"]
    assert json.loads(report_to_json(report))["hosts"][2]["warnings"] == list(
        report.hosts[2].warnings)
    # A shared home: every host has the same problem, said once.
    world.hosts = {f"h{i}": replace(h2, hostname=f"h{i}") for i in range(1, 13)}
    events.clear()
    request = session.LaunchRequest(run_request(hosts=tuple(Host(f"h{i}") for i in range(1, 13))))
    assert session.launch(request, events.append, executor=job, reach=world.reach()).exit_code == 0
    warnings = [e.text for e in events if e.level is session.EventLevel.WARNING]
    assert warnings == [f"h1, h2, h3, h4, h5, h6, h7, h8 and 4 more: import cache not used: {problem}"]


def test_a_cached_network_that_is_damaged_is_a_cache_miss(cache: Path) -> None:
    world = docker_world()
    request = run_request()
    plan = plan_run(request, {"PATH": "/usr/bin"}, family=OPEN_MPI)
    assert preflight.run_preflight(request, plan, reach=world.reach()).network is not None
    [path] = cache.glob("dtlaunch/preflight-*.json")
    entry = json.loads(path.read_text())
    for damaged in ({"cidrs": "10.1.2.0/24"}, ["10.1.2.0/24"], {**entry["network"], "cidrs": ["x"]}):
        path.write_text(json.dumps({**entry, "network": damaged}))
        world.probed.clear()
        again = preflight.run_preflight(request, plan, reach=world.reach())
        assert again.report is not None and sorted(world.probed) == ["h1", "h2"]
        assert again.network is not None and again.network.cidrs == ("10.1.2.0/24",)
        assert json.loads(path.read_text())["network"] == entry["network"]  # written anew


@needs_mpirun
def test_a_run_on_a_cached_preflight_imports_neither_the_checks_nor_the_restart_loop(
        tmp_path: Path) -> None:
    # Every job pays dtlaunch's imports before mpirun starts: a cache hit needs neither the
    # checks (the doctor, the probe, their facts), nor paramiko, nor the restart policy.
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-X", "importtime", "-m", "dtlaunch", "run", "-v", "-np", "1",
            "-H", "localhost:1", "/bin/true"]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "dtlaunch.doctor.doctor" in first.stderr  # the measurement sees the checks
    again = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "passed recently (cached)" in again.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in again.stderr.splitlines()
                if line.startswith("import time:")}
    assert "dtlaunch.run.execute" in imported
    assert not imported & {"dtlaunch.doctor.doctor", "dtlaunch.probe.command",
                           "dtlaunch.check.verdict", "dtlaunch.run.restarts",
                           "dtlaunch.cluster.slurm", "paramiko", "ctypes",
                           "dtlaunch.probe.ssh_prober", "hashlib",
                           # the cached network choice is read back without the report model
                           "dtlaunch.check.report", "dtlaunch.check.facts"}


# What a job of another kind, a failure, the checks or an option not given would need, and
# the start of an Open MPI job does not: each is imported where it is used, not on every run.
NOT_ON_THE_LAUNCH_PATH = {
    "dtlaunch.check.report", "dtlaunch.check.facts", "dtlaunch.hydra.family",
    "dtlaunch.horovod.config_file", "dtlaunch.plan.rank_filter", "dtlaunch.job.elastic",
    "dtlaunch.run.restarts", "dtlaunch.probe.prober", "hashlib",
    "pathlib",  # --output-dir's files (and the Hydra agent's folder) only
    "dtlaunch.run.slurm_watch",  # a job started through srun only
    "importlib.util",  # the rank shim's byte code reads its version where the rank does
    "ipaddress"}  # a subnet given to --iface, or the checks choosing the network


def _modules_after(tmp_path: Path, *args: str) -> set[str]:
    """Every module in sys.modules once `dtlaunch ARGS` has ended (importtime would miss
    those importlib.import_module loads: the agents, the job kinds), on its second run: the
    first of the day asks ssh and mpirun their versions and writes their caches."""
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    code = ("import sys\nfrom dtlaunch.cli import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit as end:\n    assert not end.code, end.code\n"
            "print('modules:', *sorted(sys.modules))\n")
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", code, "run", *args], capture_output=True,
                              text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("modules: ")]
    return set(line.split()[1:])


def test_a_dry_run_imports_nothing_the_job_would_not_use(tmp_path: Path) -> None:
    imported = _modules_after(tmp_path, "--dry-run", "-np", "2", "-H", "h1:1,h2:1", "/bin/true")
    assert "dtlaunch.plan.plan" in imported
    assert sorted(imported & (NOT_ON_THE_LAUNCH_PATH | {"socket", "dtlaunch.run.execute"})) == []


@needs_mpirun
def test_an_open_mpi_job_starts_without_the_other_kinds_failures_and_checks(
        tmp_path: Path) -> None:
    imported = _modules_after(tmp_path, "--no-check", "-np", "2", "-H", "localhost:2",
                              "/bin/true")
    assert "dtlaunch.run.execute" in imported
    assert sorted(imported & NOT_ON_THE_LAUNCH_PATH) == []
