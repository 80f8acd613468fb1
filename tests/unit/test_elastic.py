"""Elastic mode's pure parts (discovery output, host states, the spec) and the two formats it
shares with Horovod's own worker code, checked against the real Horovod."""

from __future__ import annotations

import base64
import contextlib
import json
import pickle
import threading
import time
from pathlib import Path

import pytest

from dtlaunch.agents.gloo_host import hosts_updated_pickle, tell_hosts_updated, worker_address
from dtlaunch.core.errors import UsageError
from dtlaunch.elastic.discovery import DiscoveryError, parse_hosts, run_script
from dtlaunch.elastic.driver import ADDED, NO_UPDATE, REMOVED, ElasticDriver, HostManager, assign
from dtlaunch.gloo.rendezvous import Store
from dtlaunch.job.elastic import elastic_spec

# --- discovery ------------------------------------------------------------------------------


def test_discovery_output_read_strictly() -> None:
    assert parse_hosts("h1:2\n\n h2:1 \n", None) == {"h1": 2, "h2": 1}
    assert parse_hosts("h1\nh2:4\n", 3) == {"h1": 3, "h2": 4}
    assert parse_hosts("", None) == {}
    for text, said in (("h1\n", "host h1 has no slots"), ("h1:0\n", "at least 1"),
                       ("h1:x\n", "whole number"), ("<html>\n", "line 1 is not a host"),
                       ("ok:1\n-rf:1\n", "line 2 is not a host")):
        with pytest.raises(DiscoveryError, match=said):
            parse_hosts(text, None)


def test_discovery_script_runs_bounded(tmp_path: Path) -> None:
    script = tmp_path / "d.sh"
    script.write_text("#!/bin/sh\necho h1:2\n")
    script.chmod(0o755)
    assert run_script(str(script), 5) == "h1:2\n"
    script.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    with pytest.raises(DiscoveryError, match="exited with code 3: broken"):
        run_script(str(script), 5)
    script.write_text("#!/bin/sh\nsleep 30\n")
    started = time.monotonic()
    with pytest.raises(DiscoveryError, match=r"did not finish within 0\.5 s"):
        run_script(str(script), 0.5)
    assert time.monotonic() - started < 5
    with pytest.raises(DiscoveryError, match="cannot run"):
        run_script(str(tmp_path / "missing"), 5)


# --- hosts ---------------------------------------------------------------------------------


def test_hosts_keep_their_order_and_updates_say_what_changed() -> None:
    hosts = HostManager()
    assert hosts.update({"a": 1, "b": 1}) == ADDED
    assert hosts.update({"b": 1, "a": 1}) == NO_UPDATE
    assert hosts.update({"c": 2, "a": 1}) == ADDED | REMOVED
    assert list(hosts.available()) == ["a", "c"]  # the oldest first: rank 0 stays put
    assert hosts.update({"c": 1, "a": 1}) == REMOVED
    assert assign({"a": 2, "c": 2}, 3) == ["a", "a", "c"]


def test_blacklist_for_good_or_for_a_cooldown() -> None:
    now = [100.0]
    forever = HostManager(clock=lambda: now[0])
    forever.update({"a": 1, "b": 1})
    forever.blacklist("b")
    now[0] += 10_000
    assert forever.update({"a": 1, "b": 1}) == NO_UPDATE and list(forever.available()) == ["a"]
    cooled = HostManager(cooldown=(10, 100), clock=lambda: now[0], draw=lambda: 0.0)
    cooled.update({"a": 1, "b": 1})
    cooled.blacklist("b")  # 10 * 2^1 = 20 s
    now[0] += 19
    assert cooled.update({"a": 1, "b": 1}) == NO_UPDATE and "b" not in cooled.available()
    now[0] += 2
    assert cooled.update({"a": 1, "b": 1}) == ADDED and "b" in cooled.available()


# --- the spec ------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "said"), [
    ({}, "needs --host-discovery-script"),
    ({"discovery_script": "d", "has_hosts": True}, "cannot be combined"),
    ({"discovery_script": "d", "min_np": None}, "needs --min-np N"),
    ({"discovery_script": "d", "max_np": 1, "min_np": 2}, "--max-np 1 is less than --min-np 2"),
    ({"discovery_script": "d", "num_proc": 9, "max_np": 4}, "-np 9 must be between"),
    ({"discovery_script": "d", "timeout": 0}, "--elastic-timeout"),
    ({"discovery_script": "d", "cooldown": (0, 5)}, "--blacklist-cooldown-range 0 5"),
])
def test_elastic_spec_refusals(kwargs: dict[str, object], said: str) -> None:
    given: dict[str, object] = {"min_np": 2, "max_np": None, "num_proc": None,
                                "discovery_script": None, "slots_per_host": None,
                                "timeout": None, "reset_limit": None, "cooldown": None,
                                "has_hosts": False}
    given.update(kwargs)
    with pytest.raises(UsageError, match=said):
        elastic_spec(**given)  # type: ignore[arg-type]


# --- Horovod's formats, against the real Horovod ---------------------------------------------


def test_the_hosts_updated_notice_is_the_one_horovod_reads() -> None:
    worker = pytest.importorskip("horovod.runner.elastic.worker")
    request = pickle.loads(hosts_updated_pickle(1_800_000_000, 3))
    assert isinstance(request, worker.HostsUpdatedRequest)
    assert (request.timestamp, request.res) == (1_800_000_000, 3)


def test_the_notice_reaches_a_real_notification_service() -> None:
    worker = pytest.importorskip("horovod.runner.elastic.worker")
    secret = pytest.importorskip("horovod.runner.common.util.secret")
    codec = pytest.importorskip("horovod.runner.common.util.codec")
    got: list[tuple[int, int]] = []

    class Manager:
        def handle_hosts_updated(self, timestamp: int, res: int) -> None:
            got.append((timestamp, res))

    key = secret.make_secret_key()
    service = worker.WorkerNotificationService(key, None, Manager())
    try:
        # What the rank PUTs is read here without any class allowed: its port and key.
        body = codec.dumps_base64((service.addresses(), key), to_ascii=False)
        found = worker_address(b"/worker_addresses/h1:0", body)
        assert found == (0, (service.get_port(), key))
        tell_hosts_updated(found[1][0], key, 42, 2)
        assert got == [(42, 2)]
        with contextlib.suppress(OSError):  # a wrong key: Horovod refuses it and closes
            tell_hosts_updated(found[1][0], b"x" * 32, 43, 2)
        assert got == [(42, 2)]
    finally:
        service.shutdown()


def test_a_worker_address_that_names_a_class_is_refused() -> None:
    class Evil:
        def __reduce__(self) -> tuple[object, ...]:
            return (print, ("owned",))

    body = base64.b64encode(pickle.dumps(({"eth0": [("1.2.3.4", 5)]}, Evil())))
    assert worker_address(b"/worker_addresses/h1:0", body) is None
    assert worker_address(b"/worker_addresses/h1:0", b"not base64 !") is None


# --- the driver, through the store's hooks ---------------------------------------------------


def test_a_round_answers_every_worker_after_all_have_asked() -> None:
    spec = elastic_spec(2, 4, None, "d", None, 30, None, None, False)
    found = {"h1": 1, "h2": 1}
    started: list[str] = []
    store = Store(["127.0.0.1"], b"s" * 32)
    driver = ElasticDriver(spec, lambda: dict(found), lambda host, token: started.append(host),
                           store.reset_round)
    driver.start(found)
    assert started == ["h1", "h2"] and driver.round == 1
    envs = {h: driver.plan_for(h)["ranks"]["0"]["env"] for h in ("h1", "h2")}  # type: ignore[index]
    assert envs["h2"]["HOROVOD_RANK"] == "1" and envs["h2"]["HOROVOD_ELASTIC"] == "1"
    # h3 appears: the next round has it; both old workers ask, then all are answered.
    found["h3"] = 1
    driver._take_discovery(found)
    assert driver.notify["h1"][1] == ADDED  # told to rank 0's host
    answers: dict[str, bytes] = {}

    def ask(host: str) -> None:
        answers[host] = driver._rank_and_size(b"GET", f"{host}:0", b"")[1]

    threads = [threading.Thread(target=ask, args=(h,)) for h in ("h1", "h2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert answers == {"h1": b"0,3,0,1,0,3", "h2": b"1,3,0,1,1,3"}
    assert started == ["h1", "h2", "h3"] and driver.round == 2
    # Every worker ends well: the job succeeded.
    for host, wid in (("h1", 0), ("h2", 1), ("h3", 2)):
        driver._exit(b"PUT", f"{host}:0:{wid}", b"0")
    assert driver.outcome is not None and driver.outcome.code == 0
    # An agent whose host has a newer one is told to end; the current one gets its plan.
    stale = json.loads(driver._plan(b"GET", "h1:0:-1", b"")[1])
    assert stale["end"] is True and stale["ranks"] == {}
    assert json.loads(driver._plan(b"GET", "h1:1:-1", b"")[1])["end"] is True  # job over
