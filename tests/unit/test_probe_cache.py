"""The probe's import cache is written only where nobody else can plant a link or a file."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from dtlaunch.check.facts import PythonFacts
from dtlaunch.probe.command import ProbeArgs, probe_local

# An interpreter without torch answers the import probe in milliseconds.
LIGHT_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def probe_facts(cache: Path, monkeypatch: pytest.MonkeyPatch) -> PythonFacts:
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    facts = probe_local(ProbeArgs(python=LIGHT_PYTHON, imports=True), timeout=120)
    assert facts.python.found and not facts.python.error
    return facts.python


def probe(cache: Path, monkeypatch: pytest.MonkeyPatch) -> bool:
    return probe_facts(cache, monkeypatch).import_cached


def written(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(("imports-", ".imports-")))


def test_cache_is_private_and_used_the_second_time(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    assert probe(tmp_path, monkeypatch) is False
    folder = tmp_path / "dtlaunch"
    assert folder.stat().st_mode & 0o777 == 0o700
    files = [n for n in written(folder) if n.endswith(".json")]
    assert len(files) == 1 and (folder / files[0]).stat().st_mode & 0o777 == 0o600
    assert probe(tmp_path, monkeypatch) is True


def test_no_cache_in_a_directory_others_can_write(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "dtlaunch"
    folder.mkdir()
    folder.chmod(0o777)
    assert probe(tmp_path, monkeypatch) is False
    assert written(folder) == []
    assert probe(tmp_path, monkeypatch) is False


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a directory to another user")
def test_no_cache_in_a_directory_owned_by_someone_else(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "dtlaunch"
    folder.mkdir(mode=0o755)
    os.chown(folder, 65534, 65534)
    assert probe(tmp_path, monkeypatch) is False
    assert written(folder) == []


def test_a_link_in_place_of_the_directory_is_not_followed(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "dtlaunch").symlink_to(elsewhere)
    assert probe(tmp_path / "cache", monkeypatch) is False
    assert written(elsewhere) == []


def test_a_planted_cache_file_is_not_believed(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    probe(tmp_path, monkeypatch)
    folder = tmp_path / "dtlaunch"
    cache = folder / next(n for n in written(folder) if n.endswith(".json"))
    victim = tmp_path / "victim"
    victim.write_text('{"torch": "9.9.9"}')
    cache.unlink()
    cache.symlink_to(victim)  # a link where the cache file should be: never read, never written
    assert probe(tmp_path, monkeypatch) is False
    assert victim.read_text() == '{"torch": "9.9.9"}'
    shutil.rmtree(folder)


def test_a_cache_directory_that_is_not_used_says_why(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    assert probe_facts(tmp_path, monkeypatch).import_cache_problem == ""
    folder = tmp_path / "dtlaunch"
    folder.chmod(0o775)
    facts = probe_facts(tmp_path, monkeypatch)
    assert not facts.import_cached
    assert facts.import_cache_problem == (f"{folder} is writable by its group or others "
                                          "(chmod 700 it)")
    folder.chmod(0o700)
    shutil.rmtree(folder)
    folder.symlink_to(tmp_path)
    assert "is a symbolic link" in probe_facts(tmp_path, monkeypatch).import_cache_problem


def test_the_cache_key_is_hashlibs_sha256_without_hashlib() -> None:
    # hashlib loads OpenSSL (~5-12 ms of CPU on every probed host); CPython's own sha256
    # gives the same key, so the caches written before stay valid.
    import hashlib
    import subprocess

    from dtlaunch import agents
    from dtlaunch.agents import remote_probe

    for data in (b"", b"probe-5", bytes(range(256)) * 9):
        assert remote_probe.hex_digest("sha256", data) == hashlib.sha256(data).hexdigest()
    code = ("import sys\nsys.argv = ['x', '', '', '0', '']\n"
            + agents.ship("remote_probe.py").text.replace('if __name__ == "__main__":\n    main()', "")
            + "\nimport_key({})\nprint(sorted(m for m in sys.modules if 'hash' in m))\n")
    done = subprocess.run([LIGHT_PYTHON, "-S", "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "'hashlib'" not in done.stdout and "'_hashlib'" not in done.stdout
