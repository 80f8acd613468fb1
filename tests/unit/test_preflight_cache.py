"""The pre-flight cache: own file, private mode, short life, keyed by what matters."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from dtlaunch.core.private_files import cache_dir
from dtlaunch.doctor import preflight, preflight_cache
from dtlaunch.job.hosts import Host
from dtlaunch.openmpi.family import OPEN_MPI
from dtlaunch.plan.plan import RunRequest
from dtlaunch.reach.ssh_options import SshOptions


def request(**kw: object) -> RunRequest:
    base: dict[str, object] = dict(hosts=(Host("h1"), Host("h2")), python=sys.executable,
                                   script=__file__, ssh=SshOptions())
    base.update(kw)
    return RunRequest(**base)  # type: ignore[arg-type]


def cache_name(key: str) -> str:
    return os.path.basename(cache_path(key))


def cache_path(key: str) -> str:
    return os.path.join(cache_dir(), preflight_cache._cache_name(key))


def read_cache(key: str, now: float | None = None) -> bool:
    """A fresh entry for `key` is there (what run_preflight reads)."""
    return preflight_cache.cached_entry(key, now) is not None


@pytest.fixture
def key(tmp_path, monkeypatch) -> str:
    """The usual request's key, its cache under tmp_path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return preflight_cache.cache_key(request(), ("h1", "h2"), "/work")


def private_folder(tmp_path) -> Path:
    """The cache's folder, there already and private."""
    folder = tmp_path / "dtlaunch"
    folder.mkdir(mode=0o700)
    return folder


def victim_file(tmp_path) -> Path:
    """A file outside the cache that a planted name would have dtlaunch write through."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    return victim


def test_cache_round_trip_and_expiry(key):
    assert not read_cache(key)
    preflight_cache.write_cache(key)
    path = cache_path(key)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
    assert read_cache(key)
    assert not read_cache(key, now=time.time() + preflight_cache.CACHE_SECONDS + 1)
    os.chmod(path, 0o666)  # writable by others: never trusted
    assert not read_cache(key)


def test_key_changes_with_what_matters(tmp_path):
    base = preflight_cache.cache_key(request(), ("h1", "h2"), "/work")
    assert base == preflight_cache.cache_key(request(), ("h1", "h2"), "/work")
    assert base != preflight_cache.cache_key(request(), ("h1", "h3"), "/work")
    assert base != preflight_cache.cache_key(request(python="/other/python"), ("h1", "h2"), "/work")
    assert base != preflight_cache.cache_key(request(ssh=SshOptions(port=2222)), ("h1", "h2"), "/work")
    assert base != preflight_cache.cache_key(request(), ("h1", "h2"), "/elsewhere")
    config = tmp_path / "cfg"
    config.write_text("Host *\n")
    with_config = preflight_cache.cache_key(request(ssh=SshOptions(config_file=str(config))),
                                      ("h1", "h2"), "/work")
    config.write_text("Host *\n  Port 2222\n")
    os.utime(config, ns=(1, 1))
    assert with_config != preflight_cache.cache_key(request(ssh=SshOptions(config_file=str(config))),
                                              ("h1", "h2"), "/work")


def test_key_check_overlaps_the_launch_only_while_dtlaunch_owns_mpiruns_ssh() -> None:
    assert preflight.may_overlap(request(), family=OPEN_MPI)
    assert preflight.may_overlap(request(mpi_args=("-mca", "btl_tcp_eager_limit", "65536")), family=OPEN_MPI)
    assert not preflight.may_overlap(request(mpi_args=("-mca", "plm_rsh_args", "-o X=y")), family=OPEN_MPI)
    assert not preflight.may_overlap(request(mpi_args=("--mca", "plm_rsh_agent", "rsh")), family=OPEN_MPI)


def test_a_damaged_cache_file_is_ignored_not_a_crash(key):
    preflight_cache.write_cache(key)
    path = cache_path(key)
    for junk in ("[]", '{"time": "abc"}', '{"time": null}', '{"key": 1}', "3", '"x"',
                 '{"time": "nan", "key": "' + key + '"}', "{"):
        with open(path, "w") as handle:
            handle.write(junk)
        assert read_cache(key) is False, junk


def test_a_damaged_cache_file_is_rewritten_by_the_next_success(tmp_path, key):
    path = private_folder(tmp_path) / cache_name(key)
    path.write_text('{"time": "abc"}')
    path.chmod(0o600)
    assert read_cache(key) is False
    preflight_cache.write_cache(key)
    assert read_cache(key)


def test_a_link_planted_at_the_cache_path_leaves_its_target_untouched(tmp_path, key):
    folder = private_folder(tmp_path)
    victim = victim_file(tmp_path)
    (folder / cache_name(key)).symlink_to(victim)
    assert read_cache(key) is False  # a link is never believed
    preflight_cache.write_cache(key)  # replaces the link, never writes through it
    assert victim.read_text() == "precious\n"
    assert not (folder / cache_name(key)).is_symlink()
    assert read_cache(key)


def test_a_file_planted_at_a_temporary_name_is_never_written(tmp_path, key):
    """Every temporary name the old writer could pick, hard-linked to a victim: O_EXCL and an
    unguessable name mean nothing already in the directory is opened for writing."""
    private_folder(tmp_path)
    victim = victim_file(tmp_path)
    victim.chmod(0o600)
    os.link(victim, f"{cache_path(key)}.{os.getpid()}.tmp")
    preflight_cache.write_cache(key)
    assert victim.read_text() == "precious\n"
    assert read_cache(key)


def test_a_fifo_at_the_cache_path_does_not_block(tmp_path, key):
    os.mkfifo(private_folder(tmp_path) / cache_name(key), 0o600)
    assert read_cache(key) is False


@pytest.mark.parametrize("setup", ["group-writable", "link", "other-owner"])
def test_a_cache_directory_that_is_not_private_is_refused_with_a_reason(
        setup, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = tmp_path / "dtlaunch"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if setup == "group-writable":
        folder.mkdir()
        folder.chmod(0o770)
        expected = "writable by its group or others"
    elif setup == "link":
        folder.symlink_to(elsewhere)
        expected = "symbolic link"
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to hand a directory to another user")
        folder.mkdir(mode=0o700)
        os.chown(folder, 65534, 65534)
        expected = "owned by uid 65534"
    problem = preflight_cache.cache_problem()
    assert problem is not None and expected in problem and str(folder) in problem
    key = preflight_cache.cache_key(request(), ("h1", "h2"), "/work")
    preflight_cache.write_cache(key)
    assert not read_cache(key)
    assert list(elsewhere.iterdir()) == []
    if setup != "link":
        assert list(folder.iterdir()) == []


def test_the_cache_directory_is_created_private(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "new" / "cache"))
    old = os.umask(0o022)
    try:
        assert preflight_cache.cache_problem() is None
    finally:
        os.umask(old)
    assert (tmp_path / "new" / "cache" / "dtlaunch").stat().st_mode & 0o777 == 0o700


def test_expired_entries_are_removed_when_a_new_one_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    old_key = preflight_cache.cache_key(request(), ("h1",), "/work")
    fresh_key = preflight_cache.cache_key(request(), ("h2",), "/work")
    new_key = preflight_cache.cache_key(request(), ("h1", "h2"), "/work")
    preflight_cache.write_cache(old_key)
    preflight_cache.write_cache(fresh_key)
    old = cache_path(old_key)
    stale = time.time() - preflight_cache.CACHE_SECONDS - 5
    os.utime(old, (stale, stale))
    other = os.path.join(os.path.dirname(old), "imports-abc.json")  # not the pre-flight's
    with open(other, "w") as handle:
        handle.write("{}")
    os.utime(other, (stale, stale))
    preflight_cache.write_cache(new_key)
    assert not os.path.exists(old)
    assert read_cache(fresh_key) and read_cache(new_key)
    assert os.path.exists(other)
