"""run.early_start: a job typed again starts its launcher before the plan, and only the
exact launcher the plan asks for is kept."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dtlaunch.doctor.preflight_cache import CACHE_SECONDS, write_cache
from dtlaunch.run import early_start as es

ARGS = ["run", "--no-check", "-H", "localhost:1", "/bin/true"]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A private cache folder (the pre-flight's reads os.environ too), nothing armed or started."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("DTLAUNCH_EARLY_START", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(es, "_armed", None)
    monkeypatch.setattr(es, "_started", None)
    yield dict(os.environ)
    es.abandon()


def _remember(env: dict[str, str], argv: list[str], job_env: dict[str, str],
              watched: list[str] = (), preflight: str | None = None,  # type: ignore[assignment]
              args: list[str] = ARGS) -> None:
    es.arm(args)
    memo = es.memo_of(argv, job_env, [], list(watched), preflight, environ=env)
    if memo is not None:
        es.keep(memo, environ=env)


def test_nothing_is_remembered_unless_the_command_line_armed_it(env: dict[str, str]) -> None:
    assert es.memo_of(["/bin/true"], {"PATH": env["PATH"]}, [], [], None, environ=env) is None
    assert es.usable_memo(ARGS, env, os.getcwd(), time.time()) is None
    _remember(env, ["/bin/true"], {"PATH": env["PATH"]})
    assert es.usable_memo(ARGS, env, os.getcwd(), time.time()) is not None


def test_values_from_the_environment_are_kept_by_name_and_secrets_never(
        env: dict[str, str], tmp_path: Path) -> None:
    _remember(env, ["/bin/true"], {"PATH": env["PATH"], "OMPI_MCA_x": "1"})
    memo = es.usable_memo(ARGS, env, os.getcwd(), time.time())
    assert memo is not None
    assert memo["env_from"] == ["PATH"] and memo["env_set"] == {"OMPI_MCA_x": "1"}
    # An inline secret (-x DB_PASSWORD=...) would be written out: no memo at all.
    folder = tmp_path / "cache" / "dtlaunch"
    for entry in folder.glob("early-*"):
        entry.unlink()
    _remember(env, ["/bin/true"], {"PATH": env["PATH"], "DB_PASSWORD": "hunter2"})
    assert not list(folder.glob("early-*"))
    assert all(entry.stat().st_mode & 0o077 == 0 for entry in folder.iterdir())


@pytest.mark.parametrize("change", ["argv", "environment", "folder", "file", "age"])
def test_any_change_of_what_the_plan_read_leaves_the_memo_unused(
        env: dict[str, str], tmp_path: Path, change: str) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=1\n")
    args = ["run", "--no-check", f"--hostfile={hostfile}", "/bin/true"]
    _remember(env, ["/bin/true"], {"PATH": env["PATH"]}, args=args)
    cwd, now = os.getcwd(), time.time()
    assert es.usable_memo(args, env, cwd, now) is not None
    if change == "argv":
        args = [*args[:-1], "/bin/false"]
    elif change == "environment":
        env = {**env, "SOMETHING": "new"}
    elif change == "folder":
        cwd = str(tmp_path / "cache")
    elif change == "file":
        hostfile.write_text("localhost slots=2\n")
    else:
        now += es.MEMO_SECONDS + 1
    assert es.usable_memo(args, env, cwd, now) is None


def test_a_pre_flight_memo_needs_its_cache_entry_with_time_to_spare(env: dict[str, str]) -> None:
    _remember(env, ["/bin/true"], {"PATH": env["PATH"]}, preflight="k" * 64)
    now = time.time()
    assert es.usable_memo(ARGS, env, os.getcwd(), now) is None  # no entry
    write_cache("k" * 64)
    assert es.usable_memo(ARGS, env, os.getcwd(), now) is not None
    # Less than the margin left: the plan that follows might find it expired.
    late = now + CACHE_SECONDS - es.PREFLIGHT_MARGIN / 2
    assert es.usable_memo(ARGS, env, os.getcwd(), late) is None
    assert es.usable_memo(ARGS, {**env, "DTLAUNCH_PREFLIGHT_CACHE": "0"}, os.getcwd(), now) is None


def test_the_same_launcher_is_adopted_and_another_is_stopped(
        env: dict[str, str], tmp_path: Path) -> None:
    """Real processes under the lifeline: the memo's launcher starts at once; the plan's
    own argv adopts it; a different plan kills it (and its whole session) first."""
    marker = tmp_path / "ran"
    argv = ["/bin/sh", "-c", f'sleep 1; echo late > "{marker}"']
    job_env = {"PATH": env["PATH"]}
    _remember(env, argv, job_env)
    assert es.try_start(ARGS, env)
    started = es.adopt(argv, job_env, [])
    assert started is not None and started.proc.poll() is None
    started.proc.wait(timeout=30)
    os.close(started.lifeline_write)
    for spool in started.spools:
        spool.close()
    assert marker.read_text() == "late\n"
    marker.unlink()

    assert es.try_start(ARGS, env)
    pid = es._started.proc.pid  # type: ignore[union-attr]
    assert es.adopt(["/bin/sh", "-c", "true"], job_env, []) is None
    time.sleep(1.5)
    assert not marker.exists()  # the stale launcher never got to its side effect
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_off_by_variable_and_never_twice(env: dict[str, str]) -> None:
    argv = ["/bin/sleep", "30"]
    _remember(env, argv, {"PATH": env["PATH"]})
    assert not es.try_start(ARGS, {**env, "DTLAUNCH_EARLY_START": "0"})
    assert es.try_start(ARGS, env)
    assert not es.try_start(ARGS, env)  # one early launcher per dtlaunch
    es.abandon()
    assert es._started is None


def test_a_damaged_memo_is_no_memo(env: dict[str, str], tmp_path: Path) -> None:
    _remember(env, ["/bin/true"], {"PATH": env["PATH"]})
    (memo,) = (tmp_path / "cache" / "dtlaunch").glob("early-*")
    data = json.loads(memo.read_text())
    del data["stamps"]
    memo.write_text(json.dumps(data))
    assert es.usable_memo(ARGS, env, os.getcwd(), time.time()) is None
    assert not es.try_start(ARGS, env)


def test_named_files_are_the_arguments_that_name_files(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "hosts").write_text("")
    args = ["run", "--hostfile", "hosts", "--env-file=missing", f"--config-file={tmp_path}/hosts",
            "-np", "2", "train.py", "--lr", "0.1"]
    assert es.named_files(args, str(tmp_path)) == [str(tmp_path / "hosts"),
                                                   str(tmp_path / "hosts"),
                                                   str(tmp_path / "train.py")]


def test_memos_older_than_their_life_are_pruned_when_one_is_written(
        env: dict[str, str], tmp_path: Path) -> None:
    folder = tmp_path / "cache" / "dtlaunch"
    _remember(env, ["/bin/true"], {"PATH": env["PATH"]})
    (fresh,) = folder.glob("early-*.json")
    stale = folder / ("early-" + "0" * 40 + ".json")
    stale.write_text("{}")
    stale.chmod(0o600)
    old = time.time() - es.MEMO_SECONDS - 60
    os.utime(stale, (old, old))
    other = folder / "preflight-x.json"  # not a memo: left alone
    other.write_text("{}")
    os.utime(other, (old, old))
    _remember(env, ["/bin/false"], {"PATH": env["PATH"]}, args=[*ARGS[:-1], "/bin/false"])
    names = {p.name for p in folder.iterdir()}
    assert stale.name not in names and fresh.name in names and other.name in names
    assert len([n for n in names if n.startswith("early-")]) == 2
