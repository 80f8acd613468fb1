"""core.version_cache: a program's version answer asked once per build of it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dtlaunch.core.version_cache import program_key, version_output


def _program(folder: Path, text: str, status: int = 0) -> Path:
    """A program that says `text` and counts how often it was asked."""
    path = folder / "mpirun"
    path.write_text(f'#!/bin/sh\necho x >> "{folder}/asked"\necho "{text}"\nexit {status}\n')
    path.chmod(0o755)
    return path


def _asked(folder: Path) -> int:
    counter = folder / "asked"
    return len(counter.read_text().splitlines()) if counter.exists() else 0


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    cache = tmp_path / "cache"
    return {**os.environ, "XDG_CACHE_HOME": str(cache)}


def test_a_build_is_asked_once(tmp_path: Path, env: dict[str, str]) -> None:
    prog = _program(tmp_path, "mpirun (Open MPI) 4.1.4")
    for _ in range(3):
        assert version_output([str(prog), "--version"], 10, env) == (0, "mpirun (Open MPI) 4.1.4\n")
    assert _asked(tmp_path) == 1
    cached = list((tmp_path / "cache" / "dtlaunch").iterdir())
    assert len(cached) == 1 and cached[0].stat().st_mode & 0o777 == 0o600


def test_a_replaced_program_is_asked_again(tmp_path: Path, env: dict[str, str]) -> None:
    prog = _program(tmp_path, "mpirun (Open MPI) 4.1.4")
    version_output([str(prog), "--version"], 10, env)
    prog = _program(tmp_path, "mpirun (Open MPI) 5.0.3")  # rewritten: new size, times
    assert version_output([str(prog), "--version"], 10, env)[1] == "mpirun (Open MPI) 5.0.3\n"
    assert _asked(tmp_path) == 2
    # Another library path may load another build's libraries: asked again too.
    version_output([str(prog), "--version"], 10, {**env, "LD_LIBRARY_PATH": "/opt/ompi5/lib"})
    assert _asked(tmp_path) == 3


def test_a_failed_answer_is_not_kept(tmp_path: Path, env: dict[str, str]) -> None:
    prog = _program(tmp_path, "error while loading shared libraries", status=127)
    for _ in range(2):
        assert version_output([str(prog), "--version"], 10, env)[0] == 127
    assert _asked(tmp_path) == 2


def test_an_unusable_cache_still_answers(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "cache" / "dtlaunch").mkdir(parents=True)
    (tmp_path / "cache" / "dtlaunch").chmod(0o777)  # writable by others: never used
    prog = _program(tmp_path, "v1")
    for _ in range(2):
        assert version_output([str(prog), "--version"], 10, env) == (0, "v1\n")
    assert _asked(tmp_path) == 2
    assert not any(p.name.startswith("version-") for p in (tmp_path / "cache" / "dtlaunch").iterdir())


def test_the_key_changes_with_the_day_and_needs_the_file(tmp_path: Path) -> None:
    prog = _program(tmp_path, "v1")
    today = program_key([str(prog), "--version"], {}, 86400 * 100 + 5)
    assert today == program_key([str(prog), "--version"], {}, 86400 * 100 + 80000)
    assert today != program_key([str(prog), "--version"], {}, 86400 * 101 + 5)
    assert program_key([str(tmp_path / "absent"), "--version"], {}, 0) is None


def test_cache_names_are_hashlibs_digests_without_loading_hashlib(tmp_path: Path) -> None:
    # hashlib loads OpenSSL, which every job's start would pay to name (or write) a cache file;
    # CPython's own sha1/sha256 give the same names, so the files written before stay valid.
    import hashlib
    import subprocess
    import sys

    from dtlaunch.agents import hex_digest

    for data in (b"", b"version-", bytes(range(256)) * 9):
        assert hex_digest("sha1", data) == hashlib.sha1(data).hexdigest()
        assert hex_digest("sha256", data) == hashlib.sha256(data).hexdigest()
    code = ("import sys\nfrom dtlaunch.core.version_cache import version_output\n"
            "from dtlaunch.doctor.preflight_cache import hex_digest\n"
            "assert version_output([sys.executable, '-V'], timeout=60)[0] == 0\n"
            "hex_digest('sha256', b'')\n"
            "print(sorted(m for m in sys.modules if 'hash' in m))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
                                           "XDG_CACHE_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert list((tmp_path / "dtlaunch").glob("version-*.txt"))  # it wrote the answer
    assert "'hashlib'" not in done.stdout and "'_hashlib'" not in done.stdout
