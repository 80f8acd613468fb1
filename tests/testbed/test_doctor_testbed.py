"""dtlaunch doctor and the run pre-flight on the real multi-host test bed (netns + sshd)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import helpers.testbed as tb
import psutil
import pytest
from helpers.procs import kill_all, sleeping, survivors, wait_for
from helpers.suite import recording_thread_imports, require_testbed

pytestmark = pytest.mark.testbed
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dbed() -> Iterator[tb.TestBed]:
    require_testbed()
    bed = tb.build_testbed(3)
    try:
        yield bed
    finally:
        bed.close()


@pytest.fixture
def cache_home(tmp_path: Path) -> Path:
    path = tmp_path / "cache"
    path.mkdir(mode=0o700)
    return path


def dtlaunch(*args: str, cache: Path | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if cache is not None:
        env["XDG_CACHE_HOME"] = str(cache)
    return subprocess.run([sys.executable, "-m", "dtlaunch", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=str(ROOT))


def doctor(bed: tb.TestBed, hosts: str, *extra: str, iface: str | None = None):
    result = dtlaunch("doctor", "--json", "-H", hosts, "--ssh-config", str(bed.ssh_config),
                      "--iface", iface or bed.subnet, "--connect-timeout", "5", *extra)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout), result


def check(doc: dict, host: str, name: str) -> dict:
    entry = next(h for h in doc["hosts"] if h["host"] == host)
    return next(c for c in entry["checks"] if c["name"] == name)


def local_ompi_version() -> str:
    out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
    return out.split(")")[1].split()[0]


def test_all_hosts_healthy(dbed: tb.TestBed) -> None:
    code, doc, _ = doctor(dbed, "h1,h2,h3")
    assert code == 0, json.dumps(doc, indent=1)
    assert doc["ok"] is True
    assert [h["host"] for h in doc["hosts"]] == ["localhost", "h1", "h2", "h3"]
    version = local_ompi_version()
    for host in doc["hosts"]:
        assert host["versions"]["mpi"] == f"Open MPI {version}"
        assert host["status"] == "pass"
    assert {check(doc, h, "hostname")["detail"] for h in ("h1", "h2", "h3")} == {"h1", "h2", "h3"}
    assert "MPI" in check(doc, "h1", "horovod")["detail"]


def test_hosts_reached_through_a_proxy_command_pass(dbed: tb.TestBed, tmp_path: Path) -> None:
    """The proxy runs under dtlaunch's tie (proxy_tied.sh) and still carries the connection."""
    relay = ROOT / "bench" / "scripts" / "slow_relay.py"
    config = tmp_path / "ssh_config"
    config.write_text(dbed.ssh_config.read_text().replace(
        "Host *\n", f"Host *\n  ProxyCommand {sys.executable} {relay} 0 %h %p\n", 1))
    result = dtlaunch("doctor", "--json", "-H", "h1,h2", "--ssh-config", str(config),
                      "--iface", dbed.subnet, "--connect-timeout", "10")
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert {check(doc, h, "hostname")["detail"] for h in ("h1", "h2")} == {"h1", "h2"}
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(relay) in (p.info["cmdline"] or [])]


def test_table_output_and_pairwise(dbed: tb.TestBed) -> None:
    result = dtlaunch("doctor", "-H", "h1,h2", "--ssh-config", str(dbed.ssh_config),
                      "--iface", dbed.subnet, "--pairwise")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all 3 host(s) ready" in result.stdout
    _code, doc, _ = doctor(dbed, "h1,h2", "--pairwise")
    assert check(doc, "h1", "pairwise")["status"] == "pass"


def test_stopped_sshd_fails_fast_others_pass(dbed: tb.TestBed) -> None:
    dbed.stop_sshd("h2")
    try:
        code, doc, _ = doctor(dbed, "h1,h2,h3")  # dtlaunch()'s bound catches a hang
    finally:
        dbed.start_sshd("h2")
    assert code == 1
    ssh = check(doc, "h2", "reach")
    assert ssh["status"] == "fail" and "refused" in ssh["detail"] and "sshd" in ssh["hint"]
    assert check(doc, "h1", "reach")["status"] == "pass"
    assert next(h for h in doc["hosts"] if h["host"] == "h3")["status"] == "pass"


def test_missing_client_key_is_auth_failure_with_fix(dbed: tb.TestBed) -> None:
    keys = dbed.host("h3").authorized_keys
    saved = keys.read_text()
    keys.write_text("")
    try:
        code, doc, _ = doctor(dbed, "h1,h3")
    finally:
        keys.write_text(saved)
    assert code == 1
    ssh = check(doc, "h3", "reach")
    assert ssh["status"] == "fail" and "refused every key" in ssh["detail"]
    assert "ssh-copy-id -i " + str(dbed.client_key) + ".pub" in ssh["hint"]


def test_missing_iface_script_and_python(dbed: tb.TestBed, tmp_path: Path) -> None:
    code, doc, _ = doctor(dbed, "h1", iface="ib7")
    assert code == 1
    iface = check(doc, "h1", "iface")
    assert iface["status"] == "fail" and "missing: ib7" in iface["detail"]
    assert "eth0 (up, " in iface["detail"]  # the host's interfaces are listed

    code, doc, _ = doctor(dbed, "h1", str(tmp_path / "nope.py"))
    assert code == 1 and check(doc, "h1", "script")["status"] == "fail"

    code, doc, _ = doctor(dbed, "h1", "--python", "/opt/no/such/python")
    assert code == 1
    assert check(doc, "h1", "python")["status"] == "fail"
    assert check(doc, "h1", "horovod")["status"] == "skip"


def test_old_mpirun_first_on_a_hosts_login_path_is_not_what_the_job_starts(
        dbed: tb.TestBed, tmp_path: Path) -> None:
    """mpirun started by its absolute path starts each host's orted from the same prefix (as
    --prefix would), so doctor checks that path there: an old mpirun first on a host's login
    PATH does not take part in the job, and the job runs."""
    fake = tmp_path / "fakempi"
    fake.mkdir()
    (fake / "mpirun").write_text("#!/bin/sh\necho 'mpirun (Open MPI) 2.1.1'\n")
    (fake / "mpirun").chmod(0o755)
    local_mpirun = shutil.which("mpirun")
    assert local_mpirun is not None
    host = dbed.host("h2")
    host.sshd_extra = (f"SetEnv PATH={fake}:/usr/bin:/bin",)
    dbed.stop_sshd(host)
    dbed.start_sshd(host)
    try:
        code, doc, _ = doctor(dbed, "h1,h2")
        script = tmp_path / "job.py"
        script.write_text("print('ran')\n")
        run = dtlaunch("run", "-H", "h1,h2", "--ssh-config", str(dbed.ssh_config), "--iface",
                       dbed.subnet, str(script), cache=tmp_path)
    finally:
        host.sshd_extra = ()
        dbed.stop_sshd(host)
        dbed.start_sshd(host)
    assert code == 0, doc
    assert check(doc, "h2", "mpirun")["detail"] == os.path.abspath(local_mpirun)
    assert check(doc, "h2", "mpi")["detail"] == check(doc, "h1", "mpi")["detail"]
    assert run.returncode == 0, run.stderr
    assert "ran" in run.stdout


def test_run_refuses_on_missing_script_python_iface(dbed: tb.TestBed, tmp_path: Path,
                                                     cache_home: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("print('ran')\n")
    base = ("run", "-H", "h1,h2", "--ssh-config", str(dbed.ssh_config))
    bad_iface = dtlaunch(*base, "--iface", "ib7", str(script), cache=cache_home)
    assert bad_iface.returncode == 1 and "(iface)" in bad_iface.stderr
    assert "fix:" in bad_iface.stderr and "ran" not in bad_iface.stdout
    bad_python = dtlaunch(*base, "--iface", dbed.subnet, "--python", "/opt/no/such/python",
                          str(script), cache=cache_home)
    assert bad_python.returncode == 1 and "(python)" in bad_python.stderr
    # A script that exists here but not at the same path on the hosts is found by the probe:
    # the test bed shares one filesystem, so point the check at a missing file via -m instead.
    bad_module = dtlaunch(*base, "--iface", dbed.subnet, "-m", "no_such_pkg_xyz",
                          cache=cache_home)
    assert bad_module.returncode == 1 and "(script)" in bad_module.stderr


def test_changed_host_key_is_hard_failure_even_after_cached_success(
        tmp_path: Path, cache_home: Path) -> None:
    why = tb.missing_requirements()
    if why:
        pytest.skip(why)  # a failure under CI=true (conftest)
    with tb.testbed(2) as bed:
        script = tmp_path / "job.py"
        script.write_text("print('ran')\n")
        argv = ("run", "-H", "h1,h2", "--ssh-config", str(bed.ssh_config), "--iface",
                bed.subnet, str(script))
        first = dtlaunch(*argv, cache=cache_home)
        assert first.returncode == 0, first.stderr
        assert first.stdout.count("ran") == 2
        assert list(cache_home.glob("dtlaunch/preflight-*.json"))
        bed.restart_with_new_host_key("h2")
        second = dtlaunch(*argv, cache=cache_home)
        assert second.returncode == 1
        assert "pre-flight checks failed: h2 (ssh)" in second.stderr
        assert "MAN-IN-THE-MIDDLE" in second.stderr
        code, doc, _ = doctor(bed, "h1,h2")
        ssh = check(doc, "h2", "reach")
        assert code == 1 and "CHANGED" in ssh["detail"] and "ssh-keygen -R" in ssh["hint"]


def test_unknown_host_key_and_accept_new(tmp_path: Path) -> None:
    why = tb.missing_requirements()
    if why:
        pytest.skip(why)  # a failure under CI=true (conftest)
    with tb.testbed(1) as bed:
        bed.known_hosts.write_text("")
        code, doc, _ = doctor(bed, "h1")
        ssh = check(doc, "h1", "reach")
        assert code == 1 and ssh["status"] == "fail" and "not in known_hosts" in ssh["detail"]
        assert "--accept-new-host-keys" in ssh["hint"]
        code, doc, _ = doctor(bed, "h1", "--accept-new-host-keys")
        assert code == 0
        assert bed.host("h1").address in bed.known_hosts.read_text()
        # OpenSSH itself now accepts the recorded key.
        done = subprocess.run(bed.ssh_argv("h1", "true"), capture_output=True, timeout=20)
        assert done.returncode == 0, done.stderr


def test_env_check_json_matches_machine() -> None:
    result = dtlaunch("env-check", "--json")
    assert result.returncode in (0, 1), result.stderr
    doc = json.loads(result.stdout)
    assert doc["cpu"]["logical_cores"] == os.cpu_count()
    assert doc["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert doc["openmpi"]["version"] == local_ompi_version()
    assert doc["openmpi"]["tcp"] is True
    names = {i["name"] for i in doc["interfaces"]}
    assert set(os.listdir("/sys/class/net")) == names
    import importlib.metadata as md

    import horovod

    assert doc["horovod"]["version"] == horovod.__version__
    assert doc["torch"]["version"] == md.version("torch")
    assert doc["os"]["kernel"] == os.uname().release


def _hung_python(tmp_path: Path, ignores_term: bool = False) -> Path:
    """An 'interpreter' that hangs: what a wedged NFS mount or a stuck import looks like."""
    path = tmp_path / "hung-python"
    trap = "trap '' TERM\n" if ignores_term else ""
    path.write_text(f"#!/bin/sh\n{trap}exec sleep 3171\n")
    path.chmod(0o755)
    return path


def _hung_pids() -> list[int]:
    return sleeping("3171")


def _none_left() -> list[int]:
    return survivors(_hung_pids)


def test_timeout_bounds_a_hung_remote_command_and_ends_it(dbed: tb.TestBed, tmp_path: Path) -> None:
    python = _hung_python(tmp_path)
    # The hung command sleeps far longer than dtlaunch()'s bound: returning at all is the test.
    result = dtlaunch("doctor", "--json", "-H", "h1,h2", "--ssh-config", str(dbed.ssh_config),
                      "--python", str(python), "--timeout", "3")
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    for host in ("h1", "h2"):
        ssh = check(doc, host, "reach")
        assert ssh["status"] == "fail" and "did not finish in 3 s" in ssh["detail"]
    assert _none_left() == [], "the hung probe was left running"


@pytest.mark.parametrize("ignores_term", [False, True], ids=["hung", "hung-ignoring-sigterm"])
def test_ctrl_c_of_doctor_leaves_nothing_running(dbed: tb.TestBed, tmp_path: Path,
                                                 ignores_term: bool) -> None:
    python = _hung_python(tmp_path, ignores_term)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dtlaunch", "doctor", "-H", "h1,h2", "--ssh-config",
         str(dbed.ssh_config), "--python", str(python)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT),
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        wait_for(lambda: len(_hung_pids()) >= 3, "the probes to start")  # this machine's, both hosts'
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert _none_left() == [], "a probe outlived Ctrl-C"


def test_a_daemon_left_by_the_interpreter_does_not_hold_the_probe(dbed: tb.TestBed,
                                                                  tmp_path: Path) -> None:
    """An interpreter wrapper that leaves a daemon behind (its own session, the channel as its
    output): the probe is complete once its shell exited with its last section, not when the
    channel's output closes (never, here), so no false 'did not finish'."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nsetsid sleep 3175 &\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    try:
        _, doc, result = doctor(dbed, "h1,h2", "--python", str(wrapper), "--timeout", "40")
        for host in ("h1", "h2"):
            assert check(doc, host, "reach")["status"] == "pass", result.stdout
            assert check(doc, host, "python")["status"] == "pass", result.stdout
    finally:
        kill_all(sleeping("3175"))


def test_no_worker_thread_imports_a_module(dbed: tb.TestBed, tmp_path: Path,
                                           cache_home: Path) -> None:
    """doctor, and run with its pre-flight full, cached and skipped: every module is imported
    on the main thread. Two threads importing at once can fail with _DeadlockError (CPython
    gh-83065, before 3.14): a host's probe would then fail for no reason of the host's."""
    log = tmp_path / "thread_imports.txt"
    env = {**recording_thread_imports(log), "XDG_CACHE_HOME": str(cache_home)}
    common = ("--ssh-config", str(dbed.ssh_config), "--iface", dbed.subnet)
    probe = str(ROOT / "tests" / "scripts" / "rank_probe.py")
    job = ("-H", "h1:1,h2:1", probe, "--out", str(tmp_path))
    said = []
    for args in (("doctor", *common, "-H", "h1,h2,h3"), ("run", "-v", *common, *job),
                 ("run", "-v", *common, *job), ("run", *common, "--no-check", *job)):
        result = subprocess.run([sys.executable, "-m", "dtlaunch", *args], capture_output=True,
                                text=True, timeout=120, env={**os.environ, **env}, cwd=str(ROOT))
        assert result.returncode == 0, result.stderr
        said.append("passed recently (cached)" in result.stderr)
    assert said == [False, False, True, False]  # the second run's pre-flight came from its cache
    assert not log.exists(), log.read_text()
