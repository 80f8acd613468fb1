"""ssh options never reach a remote shell; no launcher setting slips past the host-key guard;
ssh's exit 255 is a lost link only when it is one; a missing program is named. Pure code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.suite import dtlaunch_argv

from dtlaunch.agents import rsh
from dtlaunch.core.errors import UsageError
from dtlaunch.doctor import preflight
from dtlaunch.job.hosts import Host
from dtlaunch.mpi import JobSpec
from dtlaunch.openmpi import mca
from dtlaunch.openmpi.failures import analyze
from dtlaunch.openmpi.family import OPEN_MPI, build_mpirun_argv
from dtlaunch.openmpi.mca import (
    default_param_files,
    param_file_overrides,
    refuse_insecure,
    ssh_overrides,
)
from dtlaunch.plan.plan import RunRequest, plan_run
from dtlaunch.reach.ssh_options import SshOptions

HOSTILE = ('/keys/key$(hostname>&2)', '/keys/q"uote', "/keys/a b", "/keys/`id`", "/k/back\\slash")


def spec(identity: str, tree_spawn: bool = False, agent: str | None = "/py -I -S /d/rsh.py",
         ) -> JobSpec:
    return JobSpec(hosts=(Host("a"), Host("b")), num_proc=2, program=("p",),
                   ssh=SshOptions(identity_file=identity, config_file=identity + ".cfg", port=2222),
                   tree_spawn=tree_spawn, rsh_agent=agent)


@pytest.mark.parametrize("path", HOSTILE)
def test_ssh_paths_go_to_the_agent_by_environment_never_on_a_command_line(path: str) -> None:
    job = spec(path)
    argv = build_mpirun_argv(job)
    assert "plm_rsh_args" not in argv
    assert not any(path in arg for arg in argv)
    assert argv[argv.index("plm_rsh_agent") + 1] == "/py -I -S /d/rsh.py"
    env = OPEN_MPI.launcher_env(job)
    options = rsh.ssh_options(env)
    assert options[options.index("-i") + 1] == path
    assert options[options.index("-F") + 1] == path + ".cfg"
    assert options[options.index("-p") + 1] == "2222"


@pytest.mark.parametrize("path", HOSTILE)
@pytest.mark.parametrize("tree_spawn", [True, False])
def test_paths_that_would_reach_a_remote_shell_are_refused_in_one_line(
        path: str, tree_spawn: bool) -> None:
    # Tree spawn (or no wrapper) passes ssh options through plm_rsh_args, to a remote shell.
    agent = None if not tree_spawn else "/py -I -S /d/rsh.py"
    with pytest.raises(UsageError, match=r"--ssh-identity-file: .*cannot carry safely"):
        build_mpirun_argv(spec(path, tree_spawn=tree_spawn, agent=agent))


def test_plain_paths_still_pass_with_tree_spawn() -> None:
    argv = build_mpirun_argv(spec("/home/u/.ssh/id_ed25519", tree_spawn=True))
    assert "-i /home/u/.ssh/id_ed25519 -F /home/u/.ssh/id_ed25519.cfg" in argv[
        argv.index("plm_rsh_args") + 1]
    assert OPEN_MPI.launcher_env(spec("/k", tree_spawn=True)) == {}


def test_the_dry_run_line_carries_the_agents_options() -> None:
    request = RunRequest(hosts=(Host("a"),), python="python", script="t.py",
                         ssh=SshOptions(identity_file="/k/key$x"), rsh_agent="/py -I -S /d/rsh.py")
    plan = plan_run(request, {}, family=OPEN_MPI)
    assert plan.display().startswith("DTLAUNCH_SSH_ARGS='[")
    assert json.loads(plan.launcher_env["DTLAUNCH_SSH_ARGS"])[-2:] == ["-i", "/k/key$x"]


def test_unreadable_agent_options_mean_none() -> None:
    assert rsh.ssh_options({}) == []
    assert rsh.ssh_options({"DTLAUNCH_SSH_ARGS": "{"}) == []
    assert rsh.ssh_options({"DTLAUNCH_SSH_ARGS": '[1, "x"]'}) == []



@pytest.mark.parametrize("options", [
    [], ["-o", "BatchMode=yes", "-F", "/etc/cfg"], list(HOSTILE),
    ['q"uote', "back\\slash", "tab\tnew\nline", "\u00e9t\u00e9 \u2603", "\U0001f600", "\x01", ""],
])
def test_the_agents_options_are_read_as_json_reads_them(options: list[str]) -> None:
    for text in (json.dumps(options), json.dumps(options, ensure_ascii=False),
                 json.dumps(options, indent=2), f" {json.dumps(options)}\n"):
        assert rsh.string_list(text) == options == json.loads(text)
        assert rsh.ssh_options({"DTLAUNCH_SSH_ARGS": text}) == options


@pytest.mark.parametrize("text", ['["a",]', '["a" "b"]', '["a"] x', '[', '["a', '"a"', "{}",
                                  '[1, "x"]', '["\\q"]', "", "[null]"])
def test_anything_else_is_left_to_json(text: str) -> None:
    assert rsh.string_list(text) is None
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    good = isinstance(value, list) and all(isinstance(v, str) for v in value)
    assert rsh.ssh_options({"DTLAUNCH_SSH_ARGS": text}) == (value if good else [])


def fake_ssh(folder: Path, body: str) -> dict[str, str]:
    """A PATH whose `ssh` is a shell script: it writes the -E log's first line as ssh does."""
    folder.mkdir(exist_ok=True)
    (folder / "ssh").write_text('#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = -E ] && log=$2; '
                                'shift; done\necho OpenSSH_fake >> "$log"\n' + body)
    (folder / "ssh").chmod(0o755)
    return {"PATH": f"{folder}:/usr/bin:/bin", "TMPDIR": str(folder)}


def test_the_ssh_agent_starts_without_the_heavy_modules(tmp_path: Path) -> None:
    # It starts once per host beside mpirun: subprocess, json (with re), signal's enums and
    # contextlib cost it ~25 ms of CPU per host, so it does without them.
    env = fake_ssh(tmp_path, "echo 'debug1: rtype exit-status 0' >> \"$log\"\n")
    done = subprocess.run([sys.executable, "-I", "-S", "-X", "importtime", rsh.__file__ or "",
                           "h2", "true"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert {"_signal", "_json"} <= imported  # the measurement sees the agent's imports
    assert not imported & {"subprocess", "json", "signal", "enum", "re", "contextlib",
                           "collections", "typing", "importlib.util", "ctypes"}


@pytest.mark.parametrize(("body", "code"), [("exit 3\n", 3), ("kill -TERM $$\n", 128 + 15)])
def test_the_agent_exits_as_its_ssh_did_and_passes_no_descriptor_on(
        tmp_path: Path, body: str, code: int) -> None:
    # Popen's close_fds, kept: what the agent was given beyond 0, 1 and 2 stays out of ssh.
    read, write = os.pipe()
    env = fake_ssh(tmp_path, f"[ -e /proc/$$/fd/{write} ] && echo {write} > {tmp_path}/fds\n"
                             f"[ -e /proc/$$/fd/2 ] && echo 2 >> {tmp_path}/fds\n{body}")
    try:
        done = subprocess.run([sys.executable, "-I", "-S", rsh.__file__ or "", "h2", "true"],
                              capture_output=True, text=True, timeout=60, env=env,
                              pass_fds=(write,))
    finally:
        os.close(read)
        os.close(write)
    assert done.returncode == code, done.stderr
    assert done.stderr == ""
    assert (tmp_path / "fds").read_text().split() == ["2"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("dtlaunch-ssh-")] == []


# --- ssh's exit 255 ---------------------------------------------------------------------------

REMOTE_EXITED = """OpenSSH_9.2p1 Debian-2+deb12u10, OpenSSL 3.0.19 27 Jan 2026
debug1: Sending command: orted ...
debug1: client_input_channel_req: channel 0 rtype exit-status reply 0
debug1: channel 0: free: client-session, nchannels 1
Transferred: sent 3472, received 3328 bytes, in 0.3 seconds
Bytes per second: sent 10307.5, received 9880.0
debug1: Exit status 255
"""
LINK_DOWN = """OpenSSH_9.2p1 Debian-2+deb12u10, OpenSSL 3.0.19 27 Jan 2026
Authenticated to 10.0.0.11 ([10.0.0.11]:22) using "publickey".
debug1: Sending command: orted ...
Timeout, server 10.0.0.11 not responding.
"""


def test_exit_255_of_the_remote_command_is_not_a_lost_link() -> None:
    assert not rsh.link_lost(255, REMOTE_EXITED)
    assert not rsh.link_lost(255, REMOTE_EXITED.replace("exit-status", "exit-signal"))
    assert rsh.link_lost(255, LINK_DOWN)
    assert not rsh.link_lost(1, LINK_DOWN)


def test_only_ssh_messages_are_passed_on_from_its_log() -> None:
    assert rsh.messages(LINK_DOWN) == "Timeout, server 10.0.0.11 not responding.\n"
    assert rsh.messages(REMOTE_EXITED) == ""


# --- the host-key guard ----------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ("--mca", "plm_rsh_agent", "ssh -o StrictHostKeyChecking=no"),
    ("-mca", "orte_rsh_agent", "ssh"),
    ("-mca", "pls_rsh_agent", "ssh"),
    ("--prtemca", "plm_ssh_args", "-x"),
    ("-gmca", "plm_rsh_args", "-x"),
    ("--mca", "plm_ssh_agent", "ssh"),
    ("--mca", "prte_ssh_agent", "ssh"),
    ("--mca", "mca_base_param_files", "/tmp/p.conf"),
    ("-am", "/tmp/p.conf"),
    ("--tune", "/tmp/p.conf"),
])
def test_every_spelling_of_an_agent_override_is_seen(args: tuple[str, ...]) -> None:
    assert ssh_overrides(args, {})
    assert not OPEN_MPI.ssh_left_to_dtlaunch(args, {})


@pytest.mark.parametrize("name", ["OMPI_MCA_plm_rsh_agent", "OMPI_MCA_orte_rsh_agent",
                                  "PRTE_MCA_plm_ssh_args", "OMPI_MCA_mca_base_param_files"])
def test_agent_overrides_in_the_launchers_environment_are_seen(name: str) -> None:
    assert ssh_overrides((), {name: "ssh"}) == [name]
    assert not preflight.may_overlap(RunRequest(hosts=(), python="p"), OPEN_MPI, {name: "ssh"})


def test_other_parameters_leave_ssh_to_dtlaunch() -> None:
    args = ("--mca", "btl_tcp_eager_limit", "65536", "--report-bindings")
    env = {"OMPI_MCA_btl": "self,tcp", "PRTE_MCA_verbose": "1"}
    assert ssh_overrides(args, env) == []
    assert preflight.may_overlap(RunRequest(hosts=(), python="p", mpi_args=args), OPEN_MPI, env)


def test_the_default_parameter_files_are_the_users_and_the_installations() -> None:
    files = default_param_files("/opt/ompi/bin/mpirun", "/home/me")
    assert files[:3] == ("/home/me/.openmpi/mca-params.conf", "/home/me/.prte/mca-params.conf",
                         "/home/me/.pmix/mca-params.conf")
    assert "/opt/ompi/etc/openmpi-mca-params.conf" in files
    assert "/opt/ompi/etc/prte-mca-params.conf" in files
    assert "/etc/openmpi/openmpi-mca-params.conf" in files


def test_a_parameter_files_agent_settings_are_seen() -> None:
    text = ("# plm_rsh_agent = commented out\n"
            "btl = ^uct,openib\n"
            "  plm_rsh_args = -o StrictHostKeyChecking=no  # why not\n"
            "orte_rsh_agent=ssh\n"
            "mtl = ^ofi\n")
    assert param_file_overrides(text) == ["plm_rsh_args", "orte_rsh_agent"]
    assert param_file_overrides("btl_base_warn_component_unused=0\npml = ^ucx\n") == []


@pytest.mark.parametrize("content", ["plm_rsh_args = -o StrictHostKeyChecking=no\n", None])
def test_the_users_parameter_file_takes_the_key_check_back_before_the_launch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str | None) -> None:
    """~/.openmpi/mca-params.conf is read by every mpirun: an agent set there (or a file that
    cannot be read) means dtlaunch no longer knows how ssh runs."""
    monkeypatch.setenv("HOME", str(tmp_path))
    request = RunRequest(hosts=(), python="p")
    assert preflight.may_overlap(request, OPEN_MPI, {}, "/usr/bin/mpirun")
    conf = tmp_path / ".openmpi" / "mca-params.conf"
    conf.parent.mkdir()
    if content is None:
        os.mkfifo(conf)  # not a regular file: unreadable, never waited on
    else:
        conf.write_text(content)
    assert not preflight.may_overlap(request, OPEN_MPI, {}, "/usr/bin/mpirun")
    assert mca.param_files_set_ssh("/usr/bin/mpirun") == [
        f"{conf}: " + ("plm_rsh_args" if content else "unreadable")]


@pytest.mark.parametrize(("args", "env"), [
    (("-mca", "orte_rsh_agent", "ssh -o StrictHostKeyChecking=no"), {}),
    (("--mca", "plm_rsh_args", "-oStrictHostKeyChecking=off"), {}),
    (("--mca", "plm_rsh_args", "-o UserKnownHostsFile=/dev/null"), {}),
    (("--mca=plm_rsh_args=-o StrictHostKeyChecking no",), {}),
    ((), {"OMPI_MCA_plm_rsh_agent": "ssh -o stricthostkeychecking=no"}),
])
def test_an_override_that_accepts_any_host_key_is_refused(
        args: tuple[str, ...], env: dict[str, str]) -> None:
    with pytest.raises(UsageError, match="refuses that"):
        refuse_insecure(args, env)
    request = RunRequest(hosts=(Host("a"),), python="python", script="t.py", mpi_args=args)
    with pytest.raises(UsageError, match=r"(?i)StrictHostKeyChecking|UserKnownHostsFile"):
        plan_run(request, env, family=OPEN_MPI)


def test_a_safe_override_is_not_refused() -> None:
    refuse_insecure(("--mca", "plm_rsh_args", "-o StrictHostKeyChecking=yes -p 22"), {})


# --- a missing program -----------------------------------------------------------------------

CANNOT_EXECUTE = """--------------------------------------------------------------------------
mpirun was unable to launch the specified application as it could not access
or execute an executable:

Executable: /opt/py/bin/python3
Node: h2

while attempting to start process rank 1.
--------------------------------------------------------------------------"""
NOT_FOUND = """--------------------------------------------------------------------------
mpirun was unable to find the specified executable file, and therefore
did not launch the job.  This error was first reported for process
rank 0; it may have occurred for other processes as well.

NOTE: A common cause for this error is misspelling a mpirun command
      line parameter option (remember that mpirun interprets the first
      unrecognized command line token as the executable).

Node:       h3
Executable: python9
--------------------------------------------------------------------------"""


@pytest.mark.parametrize(("text", "rank", "host", "program"), [
    (CANNOT_EXECUTE, 1, "h2", "/opt/py/bin/python3"), (NOT_FOUND, 0, "h3", "python9")])
def test_a_missing_program_names_host_rank_and_program(
        text: str, rank: int, host: str, program: str) -> None:
    failure = analyze(text.splitlines(), ["h1", "h1"])
    assert failure is not None and (failure.rank, failure.host) == (rank, host)
    assert failure.describe() == (f"rank {rank} could not start on host {host}: {program} was "
                                  "not found or is not executable there")


@pytest.mark.parametrize("environ", [{}, {"OMPI_MCA_orte_rsh_agent": "ssh -o StrictHostKeyChecking=no"}])
def test_no_check_still_refuses_an_agent_that_accepts_any_key(tmp_path: Path,
                                                              environ: dict[str, str]) -> None:
    script = tmp_path / "t.py"
    script.write_text("")
    mpi_args = () if environ else ("--mpi-args", "-mca orte_rsh_agent 'ssh -o StrictHostKeyChecking=no'")
    result = subprocess.run(
        dtlaunch_argv("run", "--no-check", "-H", "h1:1", *mpi_args, str(script)),
        capture_output=True, text=True, timeout=60, env={**os.environ, **environ})
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "StrictHostKeyChecking=no" in result.stderr
