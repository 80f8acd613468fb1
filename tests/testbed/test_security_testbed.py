"""Secrets stay home: not on any host's command lines, not in the ranks' environment."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.suite import SCRIPTS, dtlaunch_argv
from helpers.testbed import TestBed

pytestmark = pytest.mark.testbed
PROBE = str(SCRIPTS / "rank_probe.py")
SECRET = "s3cr3t-4c1d-value"


def cmdlines_with(text: str) -> list[tuple[int, str]]:
    """(pid, command line) of every process on the machine, i.e. on every test host (`ps` on
    each), whose command line holds `text`; this test's own process left out."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if text in line:
                    out.append((int(entry.name), line))
    return out


def test_secrets_never_leak(bed: TestBed, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "HOROVOD_API_TOKEN": SECRET,  # allow-listed prefix, but secret-looking: still withheld
        "UNRELATED_SETTING": SECRET,  # not on the allow-list
        "MY_TOKEN": SECRET + "-named",  # named explicitly: sent, with a warning
    }
    argv = dtlaunch_argv("run", "--no-check", "-v", "-H", "h1:1,h2:1,h3:1", "--iface", bed.subnet,
                         "--ssh-config", str(bed.ssh_config), "-x", "MY_TOKEN",
                         "-x", "DB_PASSWORD=" + SECRET + "-inline", "--output-dir", str(tmp_path / "logs"),
                         PROBE, "--out", str(tmp_path), "--sleep", "4")
    seen: list[tuple[int, str]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.extend(cmdlines_with(SECRET))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
        out, err = proc.communicate(timeout=120)
    finally:
        stop.set()
        watcher.join()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    # The value typed after -x stays in dtlaunch's own process entry (said in a warning), and
    # nowhere else: not on mpirun's command line, not on any host's.
    # (A child dtlaunch forks shows dtlaunch's command line until it execs: same line, new pid.)
    assert proc.pid in {pid for pid, _ in seen}
    assert {line.strip() for _, line in seen} == {" ".join(argv)}, \
        "a secret appeared on another command line"
    assert all(SECRET + "-named" not in line for _, line in seen)
    warned = [line for line in err.splitlines()
              if line.startswith("dtlaunch: warning:") and "DB_PASSWORD" in line]
    assert len(warned) == 1 and "typed on the command line" in warned[0]
    assert SECRET not in out + err
    logs = "".join(p.read_text() for p in (tmp_path / "logs").iterdir())
    assert SECRET not in logs
    assert "MY_TOKEN, which looks like a secret" in err
    ranks = [json.loads(p.read_text()) for p in tmp_path.glob("rank.*.json")]
    assert len(ranks) == 3
    for rank in ranks:
        env_of_rank = rank["env"]
        assert "AWS_SECRET_ACCESS_KEY" not in env_of_rank
        assert "HOROVOD_API_TOKEN" not in env_of_rank
        assert "UNRELATED_SETTING" not in env_of_rank
        # Named ones arrive, by value, without ever being on a command line.
        assert env_of_rank["MY_TOKEN"] == SECRET + "-named"
        assert env_of_rank["DB_PASSWORD"] == SECRET + "-inline"


def test_run_as_root_flag_only_as_root(tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("")
    out = subprocess.run(dtlaunch_argv("run", "--dry-run", "-H", "a", str(script)),
                         capture_output=True, text=True, check=True).stdout
    assert ("--allow-run-as-root" in out) == (os.geteuid() == 0)
    if os.geteuid() == 0:
        # The same command as an unprivileged user never carries the flag.
        nobody = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
             "dtlaunch", "run", "--dry-run", "-H", "a", str(script)],
            capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)},
            cwd=tmp_path,
        )
        if nobody.returncode == 0:
            assert "--allow-run-as-root" not in nobody.stdout
