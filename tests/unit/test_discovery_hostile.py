"""Hostile or careless discovery output and elastic options: one line each, never a traceback
or a runaway allocation, and mid-job discovery keeps running whatever one call printed."""

from __future__ import annotations

import os
import resource
import subprocess
import time
from pathlib import Path

import pytest
from helpers.suite import REPO, dtlaunch_argv

from dtlaunch.core.errors import UsageError
from dtlaunch.elastic import driver as driver_module
from dtlaunch.elastic.discovery import DiscoveryError, parse_hosts
from dtlaunch.elastic.driver import ElasticDriver
from dtlaunch.gloo.rendezvous import Store
from dtlaunch.job.elastic import elastic_spec


@pytest.mark.parametrize(("text", "said"), [
    ("a:1\nb:\u00b2\n", "line 2: 'b:²': the slots after ':' must be a whole number"),
    ("a:\u0663\n", "line 1"),  # an Arabic-Indic 3
    ("a:1000000000\n", "line 1: 'a:1000000000': 1000000000 slots is more than the 4096"),
    ("a:" + "9" * 5000 + "\n", "line 1"),
])
def test_slots_are_ascii_digits_within_bounds(text: str, said: str) -> None:
    with pytest.raises(DiscoveryError, match=said):
        parse_hosts(text, None)


def run_with_discovery(tmp_path: Path, output: str, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "out.txt").write_text(output)
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\nexec cat {tmp_path / 'out.txt'}\n")
    script.chmod(0o755)

    def bounded() -> None:  # before: 2.6 GB, then a MemoryError traceback
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run(
        dtlaunch_argv("run", "--no-check", "--host-discovery-script", str(script), *extra,
                      "true"),
        capture_output=True, text=True, timeout=120, preexec_fn=bounded,
        env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize(("output", "said"), [
    ("localhost:\u00b2\n", "line 1: 'localhost:²'"),
    ("localhost:1000000000\n", "1000000000 slots is more than"),
])
@pytest.mark.parametrize("json_out", [False, True])
def test_bad_slots_at_the_start_are_one_line(tmp_path: Path, output: str, said: str,
                                              json_out: bool) -> None:
    done = run_with_discovery(tmp_path, output, "--min-np", "1",
                              *(["--json"] if json_out else []))
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "Error:" not in done.stderr, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], done.stderr


def test_mid_job_discovery_survives_whatever_one_call_raises(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver_module, "DISCOVER_EVERY", 0.01)
    calls: list[int] = []
    said: list[str] = []

    def discover() -> dict[str, int]:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("invalid literal for int() with base 10: '²'")
        if len(calls) == 2:
            raise MemoryError
        return {"h1": 1}

    spec = elastic_spec(1, None, None, "d", None, 30, None, None, False)
    store = Store(["127.0.0.1"], b"s" * 32)
    driver = ElasticDriver(spec, discover, lambda host, token: None, store.reset_round,
                           say=lambda level, text: said.append(text))
    driver.start({"h1": 1})
    try:
        deadline = time.monotonic() + 10
        while len(calls) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(calls) >= 4  # before: the thread died at the first call
        assert any("host discovery failed" in line for line in said), said
    finally:
        driver.stop(driver_module.Outcome(0))


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"min_np": None, "max_np": 0}, r"^--max-np: must be at least 1, got 0$"),
    ({"min_np": 99999999999}, r"^--min-np: 99999999999 processes is more than the 1000000"),
    ({"min_np": 2, "max_np": 99999999999},
     r"^--max-np: 99999999999 processes is more than the 1000000"),
])
def test_elastic_sizes_out_of_range_are_one_precise_line(kwargs: dict[str, object],
                                                         said: str) -> None:
    given: dict[str, object] = {"min_np": 2, "max_np": None, "num_proc": None,
                                "discovery_script": "d", "slots_per_host": None,
                                "timeout": None, "reset_limit": None, "cooldown": None,
                                "has_hosts": False}
    given.update(kwargs)
    with pytest.raises(UsageError, match=said):
        elastic_spec(**given)  # type: ignore[arg-type]


def _report(detail: str, hint: str) -> object:
    from dtlaunch.check.report import FAIL, CheckResult, DoctorReport, HostReport, Role

    return DoctorReport((HostReport("pb4", next(iter(Role)),
                                    (CheckResult("ssh", FAIL, detail, hint),)),))


def test_a_host_left_out_mid_job_is_named_with_its_reason() -> None:
    from dtlaunch.doctor.preflight import left_out_reason as failure_message

    why = failure_message(_report("cannot resolve pb4: Name or service not known",
                                  "check the name"))  # type: ignore[arg-type]
    # Before: "pre-flight checks failed: pb4 (ssh); not launching (fix the problems above...)"
    # with no problem printed above.
    assert "cannot resolve pb4" in why and "above" not in why and "not launching" not in why
    changed = failure_message(_report(
        "the host key of pb4 has CHANGED since it was recorded in known_hosts",
        "POSSIBLE MAN-IN-THE-MIDDLE ATTACK: do not connect until you know why the key changed"),
    )  # type: ignore[arg-type]
    assert "CHANGED" in changed and "MAN-IN-THE-MIDDLE" in changed.upper(), changed


def test_only_the_hosts_a_job_will_use_are_checked_at_the_start() -> None:
    """3,000 hosts listed, --max-np 2: the first request (what the pre-flight checks) holds
    the 2 that take ranks, not 3,000 (before: 180 s of silence, 2,822 threads)."""
    from dtlaunch.elastic.kind import first_hosts
    from dtlaunch.plan.plan import RunRequest

    spec = elastic_spec(1, 2, None, "d", None, 30, None, None, False)
    found = {f"n{i}": 1 for i in range(3000)}
    request = first_hosts(RunRequest(hosts=(), python="p", elastic=spec), lambda: dict(found))
    assert [h.name for h in request.hosts] == ["n0", "n1"] and request.num_proc == 2


def test_mid_job_only_the_hosts_needed_are_checked_and_only_checked_hosts_are_used() -> None:
    spec = elastic_spec(1, 2, None, "d", None, 30, None, None, False)
    checked: list[str] = []

    def admit(host: str) -> str | None:
        checked.append(host)
        return "ssh check failed: cannot resolve it" if host == "n2" else None

    store = Store(["127.0.0.1"], b"s" * 32)
    driver = ElasticDriver(spec, lambda: {}, lambda host, token: None, store.reset_round,
                           admit=admit)
    driver.start({"n0": 1, "n1": 1})
    try:
        found = {f"n{i}": 1 for i in range(500)}
        driver._take_discovery(found)
        assert checked == []  # before: all 498 others, one after another
        del found["n1"]  # a host leaves: one more is needed, the next ones are checked
        driver._take_discovery(found)
        assert checked == ["n2", "n3"]
        assert list(driver.hosts.available()) == ["n0", "n3"]  # never an unchecked host
    finally:
        driver.stop(driver_module.Outcome(0))
