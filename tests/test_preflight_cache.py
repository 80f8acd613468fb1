"""The pre-flight cache: own file, private mode, short life, keyed by what matters."""

from __future__ import annotations

import os
import sys
import time

from dtlaunch import preflight
from dtlaunch.hosts import Host
from dtlaunch.plan import RunRequest
from dtlaunch.ssh_options import SshOptions


def request(**kw: object) -> RunRequest:
    base: dict[str, object] = dict(hosts=(Host("h1"), Host("h2")), python=sys.executable,
                                   script=__file__, ssh=SshOptions())
    base.update(kw)
    return RunRequest(**base)  # type: ignore[arg-type]


def test_cache_round_trip_and_expiry(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    key = preflight.cache_key(request(), ("h1", "h2"), "/work")
    assert not preflight.read_cache(key)
    preflight.write_cache(key)
    path = preflight._cache_path(key)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
    assert preflight.read_cache(key)
    assert not preflight.read_cache(key, now=time.time() + preflight.CACHE_SECONDS + 1)
    os.chmod(path, 0o666)  # writable by others: never trusted
    assert not preflight.read_cache(key)


def test_key_changes_with_what_matters(tmp_path):
    base = preflight.cache_key(request(), ("h1", "h2"), "/work")
    assert base == preflight.cache_key(request(), ("h1", "h2"), "/work")
    assert base != preflight.cache_key(request(), ("h1", "h3"), "/work")
    assert base != preflight.cache_key(request(python="/other/python"), ("h1", "h2"), "/work")
    assert base != preflight.cache_key(request(ssh=SshOptions(port=2222)), ("h1", "h2"), "/work")
    assert base != preflight.cache_key(request(), ("h1", "h2"), "/elsewhere")
    config = tmp_path / "cfg"
    config.write_text("Host *\n")
    with_config = preflight.cache_key(request(ssh=SshOptions(config_file=str(config))),
                                      ("h1", "h2"), "/work")
    config.write_text("Host *\n  Port 2222\n")
    os.utime(config, ns=(1, 1))
    assert with_config != preflight.cache_key(request(ssh=SshOptions(config_file=str(config))),
                                              ("h1", "h2"), "/work")


def test_key_check_overlaps_the_launch_only_while_dtlaunch_owns_mpiruns_ssh() -> None:
    assert preflight.may_overlap(request())
    assert preflight.may_overlap(request(mpi_args=("-mca", "btl_tcp_eager_limit", "65536")))
    assert not preflight.may_overlap(request(mpi_args=("-mca", "plm_rsh_args", "-o X=y")))
    assert not preflight.may_overlap(request(mpi_args=("--mca", "plm_rsh_agent", "rsh")))


def test_a_damaged_cache_file_is_ignored_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    key = preflight.cache_key(request(), ("h1", "h2"), "/work")
    preflight.write_cache(key)
    path = preflight._cache_path(key)
    for junk in ("[]", '{"time": "abc"}', '{"time": null}', '{"key": 1}', "3", '"x"',
                 '{"time": "nan", "key": "' + key + '"}', "{"):
        with open(path, "w") as handle:
            handle.write(junk)
        assert preflight.read_cache(key) is False, junk
