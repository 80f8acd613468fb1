"""The restart policy and loop of `dtlaunch run --max-restarts`, driven with fakes (pure code)."""

from __future__ import annotations

import json
import math
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtlaunch.console.render import restart_report_json, restart_report_lines
from dtlaunch.core.errors import DtlaunchError, UsageError
from dtlaunch.core.failure import Failure
from dtlaunch.job.hosts import Host
from dtlaunch.run.events import Event
from dtlaunch.run.restarts import (
    RESTART_COUNT_ENV,
    Attempt,
    AttemptOutcome,
    RestartPolicy,
    RestartReport,
    Stop,
    blame_hosts,
    check_policy,
    decide,
    is_lost_host,
    run_attempts,
    with_restart_count,
    without,
)

OK = AttemptOutcome(0)
H3 = (Host("h1"), Host("h2"), Host("h3"))


def exited(code: int, rank: int = 1, host: str = "h2") -> AttemptOutcome:
    return AttemptOutcome(code, Failure(rank, host, exit_code=code))


def killed(sig: int, rank: int = 1, host: str = "h2") -> AttemptOutcome:
    return AttemptOutcome(128 + sig, Failure(rank, host, signal=sig))


def lost(host: str) -> AttemptOutcome:
    return AttemptOutcome(1, Failure(host=host, reason=f"lost the SSH connection to host {host}"))


@dataclass
class Cluster:
    """Fakes for the loop's callables: attempts answer from a script, time advances by hand."""

    outcomes: list[AttemptOutcome]
    failing: dict[str, str] = field(default_factory=dict)  # what every re-check reports
    sleep_signal: int | None = None
    recheck_interrupts: bool = False
    recheck_raises: str | None = None
    now: float = 1_700_000_000.0
    attempts: list[tuple[tuple[str, ...], int, int]] = field(default_factory=list)
    rechecked: list[tuple[str, ...]] = field(default_factory=list)
    slept: list[float] = field(default_factory=list)
    told: list[str] = field(default_factory=list)  # the loop's lines

    def run_attempt(self, attempt: Attempt) -> AttemptOutcome:
        self.attempts.append((tuple(h.name for h in attempt.hosts), attempt.num_proc,
                              attempt.number))
        self.now += 10.0
        return self.outcomes[len(self.attempts) - 1]

    def recheck(self, hosts: tuple[Host, ...], _left: float | None) -> Mapping[str, str]:
        self.rechecked.append(tuple(h.name for h in hosts))
        if self.recheck_interrupts:
            raise KeyboardInterrupt
        if self.recheck_raises:
            raise DtlaunchError(self.recheck_raises)
        self.now += 2.0
        return {h.name: why for h in hosts for name, why in self.failing.items() if h.name == name}

    def sleep(self, seconds: float) -> int | None:
        self.slept.append(seconds)
        if self.sleep_signal is not None:
            return self.sleep_signal
        self.now += seconds
        return None

    def clock(self) -> float:
        return self.now

    def tell(self, event: Event) -> None:
        self.told.append(event.text.split("] ", 1)[1])

    def run(self, hosts: Sequence[Host] = H3, np: int | None = None, deadline: float | None = None,
            check: bool = True, **policy: object) -> RestartReport:
        first = Attempt(0, tuple(hosts), np if np is not None else len(hosts), deadline)
        return run_attempts(first, RestartPolicy(**policy),  # type: ignore[arg-type]
                            self.run_attempt, self.recheck if check else None, self.tell,
                            wait=self.sleep, clock=self.clock)


# ---------------------------------------------------------------- the loop, scenario by scenario


def test_a_rank_failing_once_is_restarted_with_restart_count_1() -> None:
    fake = Cluster([exited(3), OK])
    report = fake.run(max_restarts=3)
    assert fake.attempts == [(("h1", "h2", "h3"), 3, 0), (("h1", "h2", "h3"), 3, 1)]
    assert report.exit_code == 0 and report.stop.kind == "finished"
    assert [r.exit_code for r in report.attempts] == [3, 0]
    assert report.attempts[0].ended == "rank 1 on host h2 exited with code 3"
    assert report.attempts[1].recheck_s == 2.0 and report.attempts[1].dropped == ()
    assert fake.rechecked == [("h1", "h2", "h3")]  # a script's exit blames no host


def test_a_lost_host_is_dropped_and_the_job_finishes_on_the_others() -> None:
    fake = Cluster([lost("h3"), OK])
    report = fake.run(max_restarts=1)
    assert fake.attempts[1] == (("h1", "h2"), 2, 1)
    assert fake.rechecked == [("h1", "h2")]  # the lost host is not even re-checked
    assert report.exit_code == 0
    assert report.attempts[1].dropped == (("h3", "lost the SSH connection to host h3"),)


def test_the_host_of_a_rank_killed_by_a_signal_is_dropped() -> None:
    fake = Cluster([killed(9, rank=0, host="h1"), OK])
    report = fake.run(max_restarts=2)
    assert fake.attempts[1] == (("h2", "h3"), 2, 1)
    assert report.attempts[1].dropped[0][0] == "h1"


def test_a_one_host_job_killed_by_a_signal_restarts_on_that_host() -> None:
    fake = Cluster([killed(9, rank=0, host="localhost"), OK])
    report = fake.run(hosts=(Host("localhost", 2),), np=2, max_restarts=1)
    assert fake.attempts[1] == (("localhost",), 2, 1) and report.exit_code == 0


def test_hosts_failing_the_recheck_are_dropped() -> None:
    fake = Cluster([exited(1), OK], failing={"h2": "ssh: connection refused"})
    report = fake.run(max_restarts=1)
    assert fake.attempts[1] == (("h1", "h3"), 2, 1)
    assert report.attempts[1].dropped == (("h2", "ssh: connection refused"),)


def test_a_failure_that_repeats_stops_early_with_the_report() -> None:
    fake = Cluster([exited(1, rank=0)] * 10)
    report = fake.run(max_restarts=9)
    assert len(fake.attempts) == 2 and report.stop.kind == "repeated"
    assert report.exit_code == 1
    lines = restart_report_lines(report)
    assert lines[0] == "attempts (1 of 9 restart(s) used):"
    assert "failed the same way twice in a row (rank 0 on host h2 exited with code 1)" in lines[-1]
    assert lines[-1].endswith("(exit 1)")


def test_different_failures_use_up_the_restarts_and_the_last_exit_status_wins() -> None:
    fake = Cluster([exited(3), exited(4), exited(5)])
    report = fake.run(max_restarts=2)
    assert len(fake.attempts) == 3 and report.stop.kind == "no-restarts-left"
    assert report.exit_code == 5


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_during_an_attempt_is_never_restarted(signum: int, code: int) -> None:
    fake = Cluster([AttemptOutcome(code, interrupted_by=signum), OK])
    report = fake.run(max_restarts=5)
    assert len(fake.attempts) == 1 and report.exit_code == code
    assert report.stop.kind == "interrupted" and fake.rechecked == []


def test_an_interrupt_during_the_delay_stops_before_the_next_attempt() -> None:
    fake = Cluster([exited(3), OK], sleep_signal=signal.SIGINT)
    report = fake.run(max_restarts=5, delay=30.0)
    assert len(fake.attempts) == 1 and fake.slept == [30.0]
    assert report.exit_code == 130 and report.stop.kind == "interrupted"


def test_an_interrupt_during_the_recheck_stops() -> None:
    fake = Cluster([exited(3), OK], recheck_interrupts=True)
    report = fake.run(max_restarts=5)
    assert len(fake.attempts) == 1 and report.exit_code == 130


def test_a_recheck_that_must_stop_everything_ends_the_loop_with_the_last_status() -> None:
    fake = Cluster([exited(3), OK], recheck_raises="host key of h2 changed")
    report = fake.run(max_restarts=5)
    assert len(fake.attempts) == 1 and report.exit_code == 3
    assert report.stop.kind == "recheck-error" and "host key of h2 changed" in report.stop.reason


def test_the_sleep_is_asked_for_a_pending_signal_even_without_a_delay() -> None:
    fake = Cluster([exited(3), OK], sleep_signal=signal.SIGTERM)
    report = fake.run(max_restarts=5)
    assert fake.slept == [0.0] and report.exit_code == 143 and len(fake.attempts) == 1


def test_a_timeout_is_never_restarted() -> None:
    fake = Cluster([AttemptOutcome(124, timed_out=True), OK])
    report = fake.run(max_restarts=5)
    assert len(fake.attempts) == 1 and report.exit_code == 124 and report.stop.kind == "timeout"


@pytest.mark.parametrize(("delay", "attempts", "slept"), [
    (0.0, 3, [0.0, 0.0]),  # attempts start at 0, 12 and 24 s; the re-check ends past 25 s
    (30.0, 1, [13.0]),  # the delay is cut to what is left, then the limit stops the loop
])
def test_timeout_bounds_the_whole_job_across_restarts(delay: float, attempts: int,
                                                      slept: list[float]) -> None:
    """--timeout 25 with attempts of 10 s: the limit is the whole job's (issue 27)."""
    fake = Cluster([exited(3 + i) for i in range(6)])
    report = fake.run(H3, 3, deadline=fake.now + 25, max_restarts=5, delay=delay)
    assert report.exit_code == 124 and report.stop.kind == "timeout"
    assert len(fake.attempts) == attempts and fake.slept == slept


def test_a_refused_host_key_is_never_a_lost_host_and_never_restarted() -> None:
    refused = AttemptOutcome(255, Failure(host="h2", final="host-key", reason="ssh refused ..."))
    assert not is_lost_host(refused.failure) and blame_hosts(refused, H3) == {}
    fake = Cluster([refused, OK])
    report = fake.run(max_restarts=3)
    assert len(fake.attempts) == 1 and not fake.rechecked
    assert report.stop.kind == "host-key" and report.exit_code == 255


def test_an_option_the_launcher_refused_is_never_restarted() -> None:
    refused = Failure(option="--foo", reason="mpirun does not take the option --foo")
    fake = Cluster([AttemptOutcome(213, refused), OK])
    report = fake.run(max_restarts=5)
    assert len(fake.attempts) == 1 and report.exit_code == 213
    assert report.stop.kind == "refused-option" and "--foo" in report.stop.reason


def test_min_np_stops_when_too_few_slots_remain() -> None:
    fake = Cluster([lost("h2"), OK])
    report = fake.run(hosts=(Host("h1", 2), Host("h2", 2)), np=4, max_restarts=3, min_np=3)
    assert len(fake.attempts) == 1 and report.stop.kind == "min-np"
    assert report.stop.reason == "only 2 slot(s) left (h1), fewer than --min-np 3"
    assert report.exit_code == 1  # the last attempt's


def test_np_shrinks_to_the_slots_left_and_never_grows_back() -> None:
    fake = Cluster([lost("h3"), exited(2), OK])
    fake.run(hosts=(Host("h1", 2), Host("h2", 2), Host("h3", 2)), np=5, max_restarts=3)
    assert [a[1] for a in fake.attempts] == [5, 4, 4]


def test_no_host_left_stops() -> None:
    fake = Cluster([lost("h1"), OK])
    report = fake.run(hosts=(Host("h1"),), np=1, max_restarts=3)
    assert report.stop.kind == "no-hosts" and len(fake.attempts) == 1


def test_report_json_has_every_attempt() -> None:
    fake = Cluster([lost("h3"), OK])
    doc = json.loads(restart_report_json(fake.run(max_restarts=2)))
    assert doc["exit_code"] == 0 and doc["stop"]["kind"] == "finished"
    first, second = doc["attempts"]
    assert first["hosts"] == ["h1", "h2", "h3"] and second["hosts"] == ["h1", "h2"]
    assert second["started_at"] == first["ended_at"] + 2.0  # the re-check took 2 s
    assert second["dropped_before"] == [{"host": "h3", "why": "lost the SSH connection to host h3"}]
    assert first["started"].endswith("Z") and second["ranks"] == 2


# ---------------------------------------------------------------- pieces


def test_restart_count_environment() -> None:
    assert with_restart_count((), 2) == (f"{RESTART_COUNT_ENV}=2",)
    items = with_restart_count(("A=1", f"{RESTART_COUNT_ENV}=7", "B"), 1)
    assert items == ("A=1", "B", f"{RESTART_COUNT_ENV}=1")


def test_check_policy_rejects_nonsense() -> None:
    with pytest.raises(UsageError, match="--min-np 5 is more than"):
        check_policy(RestartPolicy(max_restarts=1, min_np=5), 4)
    with pytest.raises(UsageError, match="--max-restarts"):
        check_policy(RestartPolicy(max_restarts=-1), 4)
    with pytest.raises(UsageError, match="--restart-delay"):
        check_policy(RestartPolicy(max_restarts=1, delay=math.nan), 4)
    assert check_policy(RestartPolicy(max_restarts=1, min_np=4), 4).min_np == 4


def test_a_node_named_by_its_full_name_is_matched_to_the_short_one() -> None:
    outcome = killed(9, host="h2.cluster.example")
    assert blame_hosts(outcome, H3) == {"h2": "rank 1 on host h2.cluster.example was killed by "
                                               "signal 9 (SIGKILL)"}


# ---------------------------------------------------------------- properties

outcomes = st.one_of(
    st.just(OK),
    st.builds(exited, st.integers(1, 5), st.integers(0, 3), st.sampled_from(["h1", "h2", "h3"])),
    st.builds(killed, st.sampled_from([6, 9, 11]), st.integers(0, 3),
              st.sampled_from(["h1", "h2", "h3", "elsewhere"])),
    st.builds(lost, st.sampled_from(["h1", "h2", "h3"])),
    st.just(AttemptOutcome(124, timed_out=True)),
    st.just(AttemptOutcome(130, interrupted_by=2)),
)


@settings(max_examples=300)
@given(st.lists(outcomes, min_size=12, max_size=12), st.integers(0, 6), st.integers(1, 3),
       st.dictionaries(st.sampled_from(["h1", "h2", "h3"]), st.just("fails"), max_size=2))
def test_loop_invariants(script: list[AttemptOutcome], max_restarts: int, min_np: int,
                         failing: dict[str, str]) -> None:
    fake = Cluster(script, failing=failing)
    report = fake.run(hosts=(Host("h1", 2), Host("h2", 1), Host("h3", 1)), np=4,
                      max_restarts=max_restarts, min_np=min_np)
    n = len(fake.attempts)
    assert 1 <= n <= max_restarts + 1
    assert report.exit_code == script[n - 1].exit_code  # the last attempt's status
    assert [a[2] for a in fake.attempts] == list(range(n))  # restart counts 0, 1, 2, ...
    for (prev_hosts, prev_np, _), (hosts, np, _) in zip(fake.attempts, fake.attempts[1:]):
        assert set(hosts) <= set(prev_hosts) and min_np <= np <= prev_np
        slots = {"h1": 2, "h2": 1, "h3": 1}
        assert np <= sum(slots[h] for h in hosts)
    for i, outcome in enumerate(script[: n - 1]):  # every attempt that was followed by another
        assert outcome.exit_code != 0 and not outcome.timed_out and outcome.interrupted_by is None
        if outcome.failure is not None and outcome.failure.rank is None and outcome.failure.host:
            assert outcome.failure.host not in fake.attempts[i + 1][0]  # a lost host is gone
        assert not set(failing) & set(fake.attempts[i + 1][0])  # so are hosts failing the check
    last = script[n - 1]
    if last.exit_code == 0 or last.timed_out or last.interrupted_by is not None:
        assert report.stop.kind in {"finished", "timeout", "interrupted"}


@given(outcomes, outcomes)
def test_a_repeat_never_restarts_and_luck_is_never_a_repeat(first: AttemptOutcome,
                                                           second: AttemptOutcome) -> None:
    stop = decide(second, Attempt(0, H3, 3, after=first), RestartPolicy(max_restarts=5))
    if isinstance(stop, Stop) and stop.kind == "repeated":
        assert second.exit_code != 0 and second.failure is not None
        assert not (second.failure.rank is None and second.failure.signal is None
                    and second.failure.exit_code is None)  # a lost host is bad luck
    if second == first and second.exit_code != 0 and not second.timed_out \
            and second.interrupted_by is None and second.failure is not None \
            and second.failure.rank is not None:
        assert isinstance(stop, Stop) and stop.kind == "repeated"


def test_without_keeps_np_with_oversubscribe() -> None:
    decision = without(Attempt(1, (Host("h1"), Host("h2")), 4), {"h2": "lost"},
                       RestartPolicy(max_restarts=1, oversubscribe=True))
    assert decision.num_proc == 4  # type: ignore[union-attr]


# ---------------------------------------------------------------- decide, rule by rule

H2x2 = (Host("h1", 2), Host("h2", 2))


@pytest.mark.parametrize(("outcome", "attempt", "policy", "kind"), [
    (OK, Attempt(0, H3, 3), RestartPolicy(5), "finished"),
    (AttemptOutcome(130, interrupted_by=2), Attempt(0, H3, 3), RestartPolicy(5), "interrupted"),
    (AttemptOutcome(124, timed_out=True), Attempt(0, H3, 3), RestartPolicy(5), "timeout"),
    (AttemptOutcome(255, Failure(host="h2", final="host-key", reason="refused")),
     Attempt(0, H3, 3), RestartPolicy(5), "host-key"),
    (AttemptOutcome(1, Failure(host="h2", final="allocation", reason="cancelled")),
     Attempt(0, H3, 3), RestartPolicy(5), "allocation"),
    (AttemptOutcome(213, Failure(option="--foo", reason="refused --foo")),
     Attempt(0, H3, 3), RestartPolicy(5), "refused-option"),
    (exited(3), Attempt(2, H3, 3), RestartPolicy(2), "no-restarts-left"),
    (exited(3), Attempt(1, H3, 3, after=exited(3)), RestartPolicy(5), "repeated"),
    (killed(9, host="h2"), Attempt(1, H3, 3, after=exited(3)), RestartPolicy(5), None),
    (lost("h1"), Attempt(0, (Host("h1"),), 1), RestartPolicy(5), "no-hosts"),
    (lost("h2"), Attempt(0, H2x2, 4), RestartPolicy(5, min_np=3), "min-np"),
    (lost("h2"), Attempt(0, H2x2, 4), RestartPolicy(5, min_np=2), None),
])
def test_decide_stops_for_each_reason_and_restarts_otherwise(
        outcome: AttemptOutcome, attempt: Attempt, policy: RestartPolicy, kind: str | None) -> None:
    decision = decide(outcome, attempt, policy)
    assert decision == decide(outcome, attempt, policy)  # pure: the same answer every time
    if kind is None:
        assert isinstance(decision, Attempt) and decision.number == attempt.number + 1
        assert decision.after == outcome
    else:
        assert isinstance(decision, Stop) and decision.kind == kind, decision


def test_decide_hands_the_next_attempt_its_number_hosts_np_and_the_deadline() -> None:
    first = Attempt(0, (Host("h1", 2), Host("h2", 2), Host("h3", 2)), 6, deadline=99.0)
    second = decide(lost("h3"), first, RestartPolicy(3))
    assert second == Attempt(1, (Host("h1", 2), Host("h2", 2)), 4, deadline=99.0,
                             dropped=(("h3", "lost the SSH connection to host h3"),),
                             after=lost("h3"))
    third = without(second, {"h1": "ssh: refused"}, RestartPolicy(3))
    assert isinstance(third, Attempt) and third.hosts == (Host("h2", 2),) and third.num_proc == 2
    assert third.dropped == (("h3", "lost the SSH connection to host h3"), ("h1", "ssh: refused"))
    gone = without(third, {"h2": "ssh: refused"}, RestartPolicy(3))
    assert isinstance(gone, Stop) and gone.kind == "no-hosts" and len(gone.dropped) == 3


attempts_strategy = st.builds(
    Attempt, st.integers(0, 6),
    st.lists(st.sampled_from([Host("h1", 2), Host("h2", 1), Host("h3", 1)]), min_size=1,
             max_size=3, unique=True).map(tuple),
    st.integers(1, 6), st.one_of(st.none(), st.floats(0, 1e9)),
    after=st.one_of(st.none(), outcomes))


@settings(max_examples=500)
@given(outcomes, attempts_strategy, st.integers(0, 6), st.integers(1, 3), st.booleans())
def test_decide_invariants(outcome: AttemptOutcome, attempt: Attempt, max_restarts: int,
                           min_np: int, oversubscribe: bool) -> None:
    policy = RestartPolicy(max_restarts, min_np, oversubscribe=oversubscribe)
    decision = decide(outcome, attempt, policy)
    if isinstance(decision, Stop):
        assert decision.kind in {"finished", "interrupted", "timeout", "no-restarts-left",
                                 "repeated", "no-hosts", "min-np"}
        if outcome.exit_code == 0 or outcome.timed_out or outcome.interrupted_by is not None:
            assert decision.dropped == ()  # nothing is blamed for an ending that is no failure
        return
    # A restart: only after a failure, with restarts left, on fewer or the same hosts.
    assert outcome.exit_code != 0 and not outcome.timed_out and outcome.interrupted_by is None
    assert attempt.number < max_restarts
    assert decision.number == attempt.number + 1 and decision.deadline == attempt.deadline
    assert decision.after == outcome
    assert set(decision.hosts) <= set(attempt.hosts) and decision.hosts
    assert {h for h, _ in decision.dropped} == {h.name for h in attempt.hosts} - {
        h.name for h in decision.hosts}
    assert min_np <= decision.num_proc <= attempt.num_proc
    if oversubscribe:
        assert decision.num_proc == attempt.num_proc
    else:
        assert decision.num_proc == min(attempt.num_proc, sum(h.slots for h in decision.hosts))
    if is_lost_host(outcome.failure):
        assert outcome.failure is not None and outcome.failure.host not in {
            h.name for h in decision.hosts}


# ---------------------------------------------------------------- the loop's own steps


def test_a_stop_for_too_few_hosts_is_told_its_drops_and_rechecks_nothing() -> None:
    """The hosts left after the failure are already too few: no re-check would change that."""
    fake = Cluster([lost("h2"), OK])
    report = fake.run(hosts=H2x2, np=4, max_restarts=3, min_np=3)
    assert report.stop.kind == "min-np" and fake.rechecked == []
    assert "dropping h2: lost the SSH connection to host h2" in fake.told
    assert fake.told[-1] == "only 2 slot(s) left (h1), fewer than --min-np 3"


def test_without_checks_no_host_is_rechecked_or_said_to_be() -> None:
    fake = Cluster([exited(3), OK], failing={"h2": "would fail"})
    report = fake.run(max_restarts=1, check=False)
    assert report.exit_code == 0 and fake.rechecked == [] and fake.attempts[1][0] == ("h1", "h2", "h3")
    assert not any(line.startswith("re-check") for line in fake.told)


def test_the_recheck_is_given_what_is_left_of_the_timeout() -> None:
    left: list[float | None] = []
    fake = Cluster([exited(3), OK])
    fake.recheck = lambda hosts, seconds: left.append(seconds) or {}  # type: ignore[method-assign]
    fake.run(deadline=fake.now + 25, max_restarts=1)
    assert left == [15.0]  # the first attempt took 10 s of 25
