"""horovodrun users' jobs on the test bed: docker0 with the same address on every host and the
network dtlaunch chooses from the hosts' own probe output; the command forms and --binding-args
run by real mpirun on real hosts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers.jobs import assert_no_strays, records
from helpers.procs import HANG, wait_for
from helpers.suite import SCRIPTS, dtlaunch_argv
from helpers.testbed import DOCKER0_ADDRESS, TestBed

from dtlaunch.check.facts import HostFacts, parse_probe_output
from dtlaunch.check.network import choose_network
from dtlaunch.horovod.options import parse_horovod_args
from dtlaunch.job.binding import double_dash
from dtlaunch.probe.command import ProbeArgs, build_remote_command, probe_local

pytestmark = pytest.mark.testbed
PROBE = str(SCRIPTS / "rank_probe.py")


def probe_over_ssh(bed: TestBed, host: str) -> HostFacts:
    """The probe doctor runs on every host, over the same kind of ssh login."""
    command = build_remote_command(ProbeArgs(python=sys.executable, imports=False))
    # The probe ends when its input closes (tied.sh), so its input stays open until it is done.
    with subprocess.Popen(bed.ssh_argv(host, command), stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        timer = threading.Timer(60, proc.kill)
        timer.start()
        try:
            assert proc.stdout is not None and proc.stderr is not None
            out, err = proc.stdout.read(), proc.stderr.read()
            code = proc.wait()
        finally:
            timer.cancel()
            proc.kill()
    assert code == 0, err
    return parse_probe_output(out)


def test_docker0_on_every_host_hangs_without_a_network_and_runs_on_the_chosen_one(
    make_bed: object, horovod: None, tmp_path: Path
) -> None:
    bed: TestBed = make_bed(2, docker0=True)  # type: ignore[operator]
    facts = {h.name: probe_over_ssh(bed, h.name) for h in bed.hosts}
    for host in facts.values():
        assert host.ifaces is not None
        assert any(i.name == "docker0" and DOCKER0_ADDRESS in i.addresses for i in host.ifaces)
    launcher = probe_local(ProbeArgs(python=sys.executable, imports=False)).ifaces
    choice = choose_network({name: f.ifaces for name, f in facts.items()}, launcher)
    print(choice.describe())
    assert choice.ok, choice.problem
    assert choice.cidrs == (bed.subnet,)
    assert dict(choice.names) == {"h1": ("eth0",), "h2": ("eth0",)}
    assert choice.left_out == ("172.17.0.0/16 (172.17.0.1 is on h1, h2: docker0)",)

    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "7", "XDG_CACHE_HOME": str(cache)}

    def argv_for(out: Path, *extra: str, timeout: str, check: str = "--no-check") -> list[str]:
        out.mkdir()
        return dtlaunch_argv("run", *([check] if check else []), "-H", "h1:1,h2:1",
                             "--ssh-config", str(bed.ssh_config), "--timeout", timeout, *extra,
                             PROBE, "--out", str(out), "--horovod")

    def run(out: Path, *extra: str, timeout: str,
            check: str = "--no-check") -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv_for(out, *extra, timeout=timeout, check=check),
                              capture_output=True, text=True, timeout=300, env=env)

    # Control: with nothing chosen, Open MPI wires the ranks through docker0, where each host
    # reaches its own bridge: the peer's connection is refused ("This attempted connection will
    # be ignored") and the job cannot finish. Seen that, Ctrl-C ends it everywhere.
    err = tmp_path / "hung.err"
    with err.open("w") as stderr:
        hung = subprocess.Popen(argv_for(tmp_path / "hung", timeout="600"), env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        wait_for(lambda: "connection will be ignored" in err.read_text() or hung.poll() is not None,
                 "Open MPI to refuse the docker0 peer")
        assert hung.poll() is None and not records(tmp_path / "hung"), err.read_text()
        hung.send_signal(signal.SIGINT)
        assert hung.wait(timeout=HANG) == 130, err.read_text()
    finally:
        if hung.poll() is None:
            hung.kill()
            hung.wait()
    assert_no_strays(bed)

    env_items = [f"{k}={v}" for k, v in choice.env()]
    done = run(tmp_path / "chosen", "--iface", choice.cidrs[0],
               *(w for item in env_items for w in ("-x", item)), timeout="240")
    assert done.returncode == 0, done.stderr
    found = records(tmp_path / "chosen")
    assert {r["host"] for r in found.values()} == {"h1", "h2"}
    assert all(r["allreduce_sum"] == 3.0 for r in found.values())  # 1 + 2
    for rank in found.values():
        assert rank["env"]["NCCL_SOCKET_IFNAME"] == "=eth0"
        assert rank["env"]["HOROVOD_GLOO_IFACE"] == "eth0"
        # The launcher's GPU list never reaches another host.
        assert "CUDA_VISIBLE_DEVICES" not in rank["env"]
    assert_no_strays(bed)

    # doctor without --iface shows the network the job would use.
    doc = subprocess.run(dtlaunch_argv("doctor", "--json", "-H", "h1,h2", "--ssh-config",
                                       str(bed.ssh_config)),
                         capture_output=True, text=True, timeout=300)
    assert doc.returncode == 0, doc.stdout + doc.stderr
    (row,) = json.loads(doc.stdout)["job"]
    assert row["name"] == "network" and row["status"] == "pass"
    assert row["detail"].startswith(f"network: {bed.subnet} (h1 eth0, h2 eth0)")

    # The user's command: no --iface; the pre-flight chooses the same network and says so.
    chosen = run(tmp_path / "auto", timeout="240", check="")
    assert chosen.returncode == 0, chosen.stderr
    assert f"dtlaunch: network: {bed.subnet} (h1 eth0, h2 eth0)" in chosen.stderr
    found = records(tmp_path / "auto")
    assert {r["host"] for r in found.values()} == {"h1", "h2"}
    assert all(r["allreduce_sum"] == 3.0 for r in found.values())
    assert all(r["env"]["NCCL_SOCKET_IFNAME"] == "=eth0" for r in found.values())
    # A cached pre-flight reuses the choice.
    again = run(tmp_path / "again", timeout="240", check="")
    assert again.returncode == 0, again.stderr
    assert f"dtlaunch: network: {bed.subnet}" in again.stderr
    assert_no_strays(bed)


def test_command_forms_run_on_every_host(bed: TestBed, tmp_path: Path) -> None:
    """horovodrun's `python SCRIPT`, a wrapper script (by name and by relative path) and `-m`,
    each on two hosts through `dtlaunch run` with its pre-flight: the program is found on the
    hosts as mpirun finds it, and the pre-flight checks the interpreter the command names."""
    wrapper = tmp_path / "wrap.sh"
    wrapper.write_text('#!/bin/sh\necho "wrapped on $(hostname)"\nexec "$@"\n')
    wrapper.chmod(0o755)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    forms = {
        "python": [sys.executable, PROBE],
        "bash": ["bash", str(wrapper), sys.executable, PROBE],
        "relative": ["./wrap.sh", sys.executable, PROBE],
        "module": ["-m", "rank_probe"],
    }
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    for name, words in forms.items():
        out = tmp_path / name
        out.mkdir()
        argv = dtlaunch_argv("run", "-H", "h1,h2", "--iface", bed.subnet, "--ssh-config",
                             str(bed.ssh_config), "--disable-cache", "--timeout", "120", *words,
                             "--out", str(out))
        # -m finds the module from the working directory, on the hosts as in the pre-flight.
        cwd = SCRIPTS if name == "module" else tmp_path
        done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=300, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, (name, done.stderr)
        assert [r["host"] for _, r in sorted(records(out).items())] == ["h1", "h2"], name
        if name in ("bash", "relative"):
            assert "wrapped on h1" in done.stdout and "wrapped on h2" in done.stdout
    assert_no_strays(bed)


@pytest.mark.parametrize("binding", ["-bind-to core -map-by core", "--bind-to none --map-by socket",
                                     "-bind-to none -map-by numa -rank-by core"])
def test_accepted_binding_args_keep_each_rank_on_the_host_dtlaunch_expects(
    bed: TestBed, tmp_path: Path, binding: str
) -> None:
    args = parse_horovod_args({"hvd_binding_args": (binding,)})
    assert args.binding_args is not None
    argv = dtlaunch_argv("run", "--no-check", "-v", "-H", "h1:2,h2:1,h3:2", "--iface", bed.subnet,
                         "--ssh-config", str(bed.ssh_config), f"--binding-args={binding}",
                         "--timeout", "120", sys.executable, PROBE, "--out", str(tmp_path))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    # The binding replaced dtlaunch's default on mpirun's line (printed by -v), in the
    # double-dash forms every Open MPI takes.
    line = next(x for x in done.stderr.splitlines() if x.startswith("dtlaunch: running: "))
    assert " ".join(double_dash(args.binding_args)) in line
    assert "--bind-to none --map-by slot" not in line
    found = records(tmp_path)
    assert tuple(found[r]["host"] for r in sorted(found)) == ("h1", "h1", "h2", "h3", "h3")
