"""The probe script itself, run locally (the same text runs remotely)."""

from __future__ import annotations

import os
import shlex
import sys

from dtlaunch.probe import ProbeArgs, build_remote_command, probe_local


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
    assert argv[4] == nasty and argv[5] == nasty and argv[7] == nasty
