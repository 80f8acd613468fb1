"""The probe script itself, run locally (the same text runs remotely)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading

from helpers.procs import gone, kill_all, read_pid, sleeping

from dtlaunch.agents import ship
from dtlaunch.probe.command import ProbeArgs, build_remote_command, probe_local


def test_local_probe_reports_this_machine(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    facts = probe_local(ProbeArgs(python=sys.executable, script=str(script), module="json",
                                  cwd=str(tmp_path)))
    assert facts.hostname == os.uname().nodename
    assert facts.script_exists is True
    assert facts.python.found and facts.python.version.startswith(
        "{}.{}".format(*sys.version_info[:2]))
    assert facts.python.module_found is True
    assert facts.ifaces is not None and any(i.name == "lo" for i in facts.ifaces)


def test_local_probe_missing_python_and_script(tmp_path):
    facts = probe_local(ProbeArgs(python=str(tmp_path / "nope" / "python"),
                                  script=str(tmp_path / "missing.py"), imports=False))
    assert facts.python.found is False
    assert facts.script_exists is False


def test_remote_command_quotes_every_piece():
    nasty = "/tmp/a b/$(touch pwned);`x`'\""
    command = build_remote_command(ProbeArgs(python=nasty, script=nasty, cwd=nasty))
    argv = shlex.split(command)
    assert argv[0:2] == ["sh", "-c"]
    probe = argv.index("dtlaunch-probe")
    assert argv[probe - 3:probe - 1] == ["sh", "-c"]
    assert argv[probe + 1] == nasty and argv[probe + 2] == nasty and argv[probe + 4] == nasty


def tied(*command: str) -> subprocess.Popen[bytes]:
    """A command run as sshd runs one: its own session, its input a pipe from the client."""
    return subprocess.Popen(["sh", "-c", ship("tied.sh").text, "dtlaunch-tied", *command],
                            stdin=subprocess.PIPE, start_new_session=True)


def test_a_tied_command_ends_with_everything_it_started_when_its_input_closes(tmp_path):
    pidfile = tmp_path / "pid"
    proc = tied("sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait")
    grandchild = read_pid(pidfile, "the command to start")
    assert proc.poll() is None  # input still open: it runs on
    assert proc.stdin is not None
    proc.stdin.close()  # what sshd does when the client closes the channel
    assert proc.wait(timeout=10) != 0
    assert not gone([grandchild]), "the tied command's child outlived it"


def test_a_tied_command_that_ignores_sigterm_is_killed_when_its_input_closes(tmp_path):
    pidfile = tmp_path / "pid"
    proc = tied("sh", "-c", f"trap '' TERM; sleep 300 & echo $! > {pidfile}; wait")
    stubborn = read_pid(pidfile, "the command to start")
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=10)
    assert not gone([stubborn]), "a child that ignores SIGTERM outlived its channel"


def test_a_tied_command_that_finishes_returns_its_status_with_input_open():
    proc = tied("sh", "-c", "echo out; exit 7")
    assert proc.wait(timeout=10) == 7
    assert proc.stdin is not None
    proc.stdin.close()


def _fake_mpi(folder, version, daemon):
    folder.mkdir(parents=True)
    for name, text in (("mpirun", f"#!/bin/sh\necho 'mpirun (Open MPI) {version}'\n"),
                       (daemon, "#!/bin/sh\n")):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder / "mpirun"


def test_probe_checks_the_launchers_mpirun_path_not_the_login_path(tmp_path):
    launcher = _fake_mpi(tmp_path / "venv" / "bin", "5.0.11", "prted")
    other = _fake_mpi(tmp_path / "other" / "bin", "4.1.4", "orted")
    old_path = os.environ["PATH"]
    os.environ["PATH"] = f"{other.parent}:{old_path}"
    try:
        facts = probe_local(ProbeArgs(python=sys.executable, imports=False,
                                      mpi_launcher=str(launcher)))
        plain = probe_local(ProbeArgs(python=sys.executable, imports=False))
    finally:
        os.environ["PATH"] = old_path
    assert (facts.mpi_launcher, facts.mpirun) == (str(launcher), str(launcher))
    assert facts.orted == str(launcher.parent / "prted")
    assert facts.mpi is not None and facts.mpi.version == "5.0.11"
    assert plain.mpirun == str(other) and plain.mpi is not None and plain.mpi.version == "4.1.4"


def test_probe_reports_a_missing_launcher_path(tmp_path):
    facts = probe_local(ProbeArgs(python=sys.executable, imports=False,
                                  mpi_launcher=str(tmp_path / "venv" / "bin" / "mpirun")))
    assert facts.mpi_launcher == str(tmp_path / "venv" / "bin" / "mpirun")
    assert facts.mpirun is None and facts.orted is None and facts.mpi is None


def test_a_daemon_left_by_the_interpreter_does_not_hold_the_local_probe(tmp_path):
    """An interpreter wrapper that leaves a daemon (own session, our pipe as its stdout): the
    probe is read to its last section, not to an end of file that never comes."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nsetsid sleep 3174 &\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    got: list[object] = []
    worker = threading.Thread(target=lambda: got.append(probe_local(
        ProbeArgs(python=str(wrapper), imports=False), timeout=60)), daemon=True)
    try:
        worker.start()
        worker.join(120)
        assert not worker.is_alive(), "the local probe waited on the daemon's pipe"
        [facts] = got
        assert facts.python.found and not facts.python.error  # type: ignore[attr-defined]
    finally:
        kill_all(sleeping("3174"))


def test_a_bare_interpreter_name_is_looked_up_on_the_jobs_path(tmp_path):
    # The ranks find `python` on the PATH dtlaunch exports, so the probe looks there too.
    bin_dir = tmp_path / "jobbin"
    bin_dir.mkdir()
    wrapper = bin_dir / "python"
    wrapper.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    wrapper.chmod(0o755)
    facts = probe_local(ProbeArgs(python="python", imports=False,
                                  path=f"{bin_dir}{os.pathsep}{os.defpath}"), timeout=60)
    assert facts.python.found and facts.python.executable == sys.executable
    missing = probe_local(ProbeArgs(python="python", imports=False, path=str(tmp_path / "none")),
                          timeout=60)
    assert not missing.python.found
    assert missing.python.error == "not found on the PATH the job exports"


def test_the_commands_executable_is_looked_up_on_the_jobs_path(tmp_path):
    tool = tmp_path / "jobbin" / "mytool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    job_path = f"{tool.parent}{os.pathsep}{os.defpath}"
    found = probe_local(ProbeArgs(python=sys.executable, imports=False, path=job_path,
                                  program="mytool"), timeout=60)
    assert found.program_path == str(tool)
    for program in ("no-such-tool-here", str(tmp_path / "nope")):
        missing = probe_local(ProbeArgs(python=sys.executable, imports=False, path=job_path,
                                        program=program), timeout=60)
        assert missing.program_path == ""
