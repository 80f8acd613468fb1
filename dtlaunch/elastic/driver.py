"""The elastic job's driver: rounds of ranks over the hosts discovery lists, as Horovod's own
elastic driver runs them, served through the job's signed rendezvous store.

How a job moves (Horovod's contract with its workers, `hvd.elastic.run`):

- A round is an assignment of ranks to (host, local rank) slots. Its workers start with their
  place in the environment; later rounds tell it them through the store: on a reset a worker
  asks `GET /rank_and_size/HOST:LOCAL_RANK`, which counts it as ready and is answered once
  every worker of the round has either asked or ended (a barrier). Then the next round's
  assignment answers them; a slot no longer assigned is never answered: its host's agent stops
  that worker (quietly: it was drained, not failed).
- When the barrier completes: a success ends the job; failures blacklist their hosts; the reset
  limit is checked; then the next round waits (up to `--elastic-timeout`) for `--min-np` slots
  and assigns at most `--max-np`. Falling short ends the job with one line, never a hang.
- Discovery runs every second. A change that would change the assignment is told to rank 0's
  worker (Horovod's HostsUpdatedRequest, handed over by its host's agent on that host), so
  every rank stops at its next `state.commit()` and resets into a round with the new hosts. A
  new host is checked first (`admit`, the pre-flight) and left out, named, if it fails.
- Each host's agent long-polls `GET /_dtlaunch_plan/HOST:GEN` for the local ranks it should
  run (starting new ones, stopping drained ones) and reports each worker's end with
  `PUT /_dtlaunch_exit/HOST:LOCAL_RANK:WORKER`. An agent silent for LOST_AFTER seconds has lost
  its host: its workers count as failed.

Which discovered hosts may take ranks, in which order, and what changed (HostManager,
horovodrun's rules, pure: the clock and the random draw are passed in):

- Hosts keep the order they first appeared in, so the oldest hosts keep the lowest ranks (rank
  0, which holds the state the others are synced from, stays put while its host does).
- A host where a rank failed is blacklisted. With `--blacklist-cooldown-range LOW HIGH` it may
  come back after a cooldown that doubles with each failure (LOW * 2^n plus up to LOW at
  random, within [LOW, HIGH]); without it, never.
- A host dtlaunch refused to admit (its pre-flight failed) is left out until it leaves
  discovery and comes back; one not checked yet (not needed so far) is left out until it is.

Threads: the store's (one per request), discovery, the watch on agents, and one that waits for
the next round's slots; one lock and one condition guard everything.
"""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from dtlaunch.elastic.discovery import DiscoveryError
from dtlaunch.gloo.ranks import GlooRank, place_ranks, scope_sizes
from dtlaunch.job.elastic import ElasticSpec
from dtlaunch.job.hosts import MAX_NUM_PROC
from dtlaunch.jobkind import Say

READY, SUCCESS, FAILURE = "ready", "success", "failure"
PLAN_SCOPE, EXIT_SCOPE, RANK_SCOPE = "_dtlaunch_plan", "_dtlaunch_exit", "rank_and_size"
DISCOVER_EVERY = 1.0
POLL_WAIT = 5.0  # an agent's long poll is answered after this long without a change
LOST_AFTER = 20.0  # an agent not heard from this long has lost its host
DRAIN_HOLD = 60.0  # a drained worker's rank_and_size is held this long before "-1"
REMOVED_ANSWER = b"-1,-1,-1,-1,-1,-1"
NO_UPDATE, REMOVED, ADDED = 0, 1, 2  # Horovod's HostUpdateResult flags


@dataclass
class HostState:
    blacklisted: bool = False
    failures: int = 0
    cooldown_until: float = 0.0  # 0: for good


@dataclass
class HostManager:
    cooldown: tuple[int, int] | None = None
    clock: Callable[[], float] = field(default=lambda: 0.0)
    draw: Callable[[], float] = field(default=random.random)
    slots: dict[str, int] = field(default_factory=dict)  # the last discovery's hosts
    order: list[str] = field(default_factory=list)  # hosts in the order they appeared
    states: dict[str, HostState] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # host -> why it was not admitted
    unchecked: set[str] = field(default_factory=set)  # listed, not checked yet (not needed)

    def update(self, found: Mapping[str, int]) -> int:
        """Take a discovery's result; the update flags (REMOVED, ADDED) against the last."""
        now = self.clock()
        result = NO_UPDATE
        for host in self.slots:
            if host not in found:
                result |= REMOVED
                self.refused.pop(host, None)  # gone: checked again if it comes back
        for host, count in found.items():
            before = self.slots.get(host)
            if before is None or count > before:
                result |= ADDED
            elif count < before:
                result |= REMOVED
            state = self.states.get(host)
            if state is not None and state.blacklisted and 0 < state.cooldown_until <= now:
                state.blacklisted = False  # its cooldown is over: it may take ranks again
                result |= ADDED
        self.slots = dict(found)
        self.order = [h for h in self.order if h in found] + [h for h in found
                                                               if h not in self.order]
        return result

    def blacklist(self, host: str) -> None:
        state = self.states.setdefault(host, HostState())
        now = self.clock()
        if state.blacklisted and state.cooldown_until > now:
            return
        state.blacklisted = True
        if self.cooldown is None:
            state.cooldown_until = 0.0  # for good
            return
        state.failures += 1
        low, high = self.cooldown
        delay = low * (1 << min(state.failures, 30)) + self.draw() * low
        state.cooldown_until = now + max(low, min(high, delay))

    def is_blacklisted(self, host: str) -> bool:
        return self.states.get(host, HostState()).blacklisted

    def available(self) -> dict[str, int]:
        """Hosts that may take ranks now, in assignment order, with their slots."""
        return {h: self.slots[h] for h in self.order
                if not self.is_blacklisted(h) and h not in self.refused
                and h not in self.unchecked}

    def available_slots(self) -> int:
        return sum(self.available().values())


def assign(available: Mapping[str, int], max_np: int | None) -> list[str]:
    """Each rank's host, rank order: hosts filled one after another (as horovodrun does, so a
    host's ranks are neighbours), at most `max_np`."""
    # Without --max-np, no more than one past what any plan takes (which then says so in
    # one line): thousands of hosts with thousands of slots never build a list of millions.
    limit = max_np if max_np is not None else MAX_NUM_PROC + 1
    return list(itertools.islice((h for h, n in available.items() for _ in range(n)), limit))


@dataclass(frozen=True)
class Worker:
    id: int
    slot: GlooRank
    size: int


@dataclass
class Outcome:
    code: int
    message: str | None = None  # why the job ended, when it was not every worker's success
    worker: Worker | None = None  # the failed worker it names


@dataclass
class ElasticDriver:
    spec: ElasticSpec
    discover: Callable[[], dict[str, int]]
    start_host: Callable[[str, int], None]  # start an agent (host, its token); again if lost
    reset_store: Callable[[Mapping[str, int]], None]  # a new round's rendezvous scopes
    admit: Callable[[str], str | None] = lambda host: None  # a new host's pre-flight: why not
    say: Say = lambda level, text: None
    clock: Callable[[], float] = time.monotonic
    hosts: HostManager = field(default_factory=HostManager)
    admitted: set[str] = field(default_factory=set)
    round: int = 0
    resets: int = 0
    members: dict[tuple[str, int], Worker] = field(default_factory=dict)
    recorded: dict[tuple[str, int], str] = field(default_factory=dict)
    failed_first: list[tuple[Worker, int]] = field(default_factory=list)
    gen: int = 0
    notify: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # host -> (ts, res, lr)
    agents: dict[str, float] = field(default_factory=dict)  # host -> last heard from
    tokens: dict[str, int] = field(default_factory=dict)  # host -> its current agent's token
    outcome: Outcome | None = None
    next_id: int = 0
    last_ts: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _advancing: bool = False

    # --- starting and ending ---------------------------------------------------------------

    def start(self, initial: Mapping[str, int]) -> None:
        """The first round on `initial` (already discovered and checked); then the threads."""
        self.hosts.clock = self.clock
        self.hosts.cooldown = self.spec.cooldown
        self.admitted.update(initial)
        self._take_discovery(initial, first=True)
        with self._cond:
            self._begin_round_locked(self.spec.start_np)
        for target in (self._discovery_loop, self._watch_agents):
            threading.Thread(target=target, daemon=True, name="dtlaunch-elastic").start()

    def stop(self, outcome: Outcome) -> None:
        with self._cond:
            self._finish_locked(outcome)

    def _finish_locked(self, outcome: Outcome) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.gen += 1
            self._cond.notify_all()

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    # --- rounds -----------------------------------------------------------------------------

    def _begin_round_locked(self, need: int) -> None:
        """Assign the next round if enough slots are there now, else wait for them (in a
        thread, up to --elastic-timeout)."""
        if self.hosts.available_slots() >= need:
            self._assign_locked()
            return
        self._advancing = True
        threading.Thread(target=self._wait_for_slots, args=(need,), daemon=True).start()

    def _wait_for_slots(self, need: int) -> None:
        deadline = self.clock() + self.spec.timeout
        self.say("note", f"elastic: waiting up to {self.spec.timeout:g} s for {need} slot(s); "
                         f"{self.hosts.available_slots()} available")
        with self._cond:
            while not self.finished and self.hosts.available_slots() < need:
                left = deadline - self.clock()
                if left <= 0:
                    have = self.hosts.available()
                    listed = ", ".join(f"{h}:{n}" for h, n in have.items()) or "none"
                    self._finish_locked(Outcome(1, (
                        f"elastic: only {sum(have.values())} slot(s) available ({listed}) after "
                        f"waiting {self.spec.timeout:g} s for {need} (--min-np "
                        f"{self.spec.min_np}, --elastic-timeout {self.spec.timeout:g})")))
                    break
                self._cond.wait(min(left, 1.0))
            self._advancing = False
            if not self.finished:
                self._assign_locked()

    def _assign_locked(self) -> None:
        rank_hosts = assign(self.hosts.available(), self.spec.max_np)
        previous = {w.slot.host for w in self.members.values()}
        if previous and not previous & set(rank_hosts):
            self._finish_locked(Outcome(1, "elastic: no host of the last round is left to "
                                           "hand the training state to the new ones"))
            return
        slots = place_ranks(rank_hosts)
        size = len(slots)
        before = self.members
        members: dict[tuple[str, int], Worker] = {}
        for slot in slots:  # a slot kept keeps its worker's number; a new one gets the next
            key = (slot.host, slot.local_rank)
            old = before.get(key)
            if old is None:
                number, self.next_id = self.next_id, self.next_id + 1
            else:
                number = old.id
            members[key] = Worker(number, slot, size)
        self.round += 1
        self.members = members
        self.recorded = {}
        self.notify = {}
        self.reset_store(scope_sizes(slots))
        self.gen += 1
        hosts = list(dict.fromkeys(rank_hosts))
        self.say("note", f"elastic: round {self.round}: {size} rank(s) on "
                         f"{', '.join(f'{h}:{rank_hosts.count(h)}' for h in hosts)}")
        for host in hosts:
            if host not in self.agents:
                self.agents[host] = self.clock() + LOST_AFTER  # time to start and first poll
                self.tokens[host] = self.tokens.get(host, 0) + 1
                self.start_host(host, self.tokens[host])
        self._cond.notify_all()

    def _record_locked(self, key: tuple[str, int], state: str, code: int = 0) -> None:
        worker = self.members.get(key)
        if worker is None or self.finished:
            return
        if self.recorded.get(key) in (SUCCESS, FAILURE):
            return
        self.recorded[key] = state
        if state == FAILURE:
            self.failed_first.append((worker, code))
        if len(self.recorded) >= len(self.members) and not self._advancing:
            self._advance_locked()

    def _advance_locked(self) -> None:
        """Every worker of the round has asked for its next place or ended."""
        states = self.recorded
        failures = [self.members[k] for k, s in states.items() if s == FAILURE]
        if any(s == SUCCESS for s in states.values()):
            if failures:
                self._fail_locked(failures, None)
            else:
                self._finish_locked(Outcome(0))
            return
        if len(failures) == len(states):
            self._fail_locked(failures, "elastic: every worker of the round failed")
            return
        for worker in failures:
            if not self.hosts.is_blacklisted(worker.slot.host):
                self.say("warning", f"elastic: host {worker.slot.host} blacklisted: worker "
                                    f"{worker.id} (rank {worker.slot.rank}) failed")
            self.hosts.blacklist(worker.slot.host)
        if all(self.hosts.is_blacklisted(h) for h, _ in states):
            self._fail_locked(failures, "elastic: every host of the round is blacklisted")
            return
        if self.spec.reset_limit is not None and self.resets >= self.spec.reset_limit:
            self._finish_locked(Outcome(1, f"elastic: the job reset {self.resets} time(s), "
                                           f"the --reset-limit; stopping"))
            return
        self.resets += 1
        self._begin_round_locked(self.spec.min_np)

    def _fail_locked(self, failures: list[Worker], why: str | None) -> None:
        """The job ends with the first of `failures` to fail, and its code."""
        worker, code = next(((w, c) for w, c in self.failed_first if w in failures),
                            (failures[0], 1))
        self._finish_locked(Outcome(code or 1, why, worker))

    # --- what the store serves --------------------------------------------------------------

    def hooks(self) -> dict[str, Callable[[bytes, str, bytes], tuple[int, bytes]]]:
        return {RANK_SCOPE: self._rank_and_size, PLAN_SCOPE: self._plan,
                EXIT_SCOPE: self._exit}

    def _rank_and_size(self, method: bytes, key: str, body: bytes) -> tuple[int, bytes]:
        if method != b"GET":
            return 405, b""
        host, _, local = key.rpartition(":")
        if not host or not local.isdigit():
            return 400, b""
        where = (host, int(local))
        with self._cond:
            asked_in = self.round
            self._record_locked(where, READY)
            while not self.finished and self.round == asked_in:
                self._cond.wait(1.0)
            worker = self.members.get(where)
            if worker is None or self.finished:
                # Drained (or the job is over): its agent stops it; the answer only comes if
                # that never happens.
                end = self.clock() + DRAIN_HOLD
                while self.clock() < end:
                    self._cond.wait(1.0)
                return 200, REMOVED_ANSWER
            s = worker.slot
            place = (s.rank, worker.size, s.local_rank, s.local_size, s.cross_rank, s.cross_size)
            return 200, ",".join(map(str, place)).encode("ascii")

    def _plan(self, method: bytes, key: str, body: bytes) -> tuple[int, bytes]:
        """An agent's long poll (HOST:TOKEN:GEN): its plan once it differs from generation GEN.
        An agent whose host was given a new one since (it was taken for lost) is told to end."""
        parts = key.split(":")
        if method != b"GET" or len(parts) != 3 or not parts[1].isdigit() \
                or not parts[2].lstrip("-").isdigit():
            return 400, b""
        host, token, seen = parts[0], int(parts[1]), int(parts[2])
        if self.tokens.get(host) != token:
            return 200, json.dumps({"gen": self.gen, "ranks": {}, "end": True}).encode()
        if host in self.agents:  # heard from, whoever holds the lock (one dict write)
            self.agents[host] = self.clock()
        with self._cond:
            end = self.clock() + POLL_WAIT
            while self.gen == seen and self.clock() < end:
                self._cond.wait(end - self.clock())
            if host in self.agents:
                self.agents[host] = self.clock()
            if self.gen == seen:
                return 404, b""
            return 200, json.dumps(self.plan_for(host)).encode("utf-8")

    def plan_for(self, host: str) -> dict[str, object]:
        """The host's workers: each one's place, Horovod's elastic switch, its number (its tag)."""
        ranks = {} if self.finished else {
            str(w.slot.local_rank): {"id": w.id, "env": {**w.slot.env(w.size), "HOROVOD_ELASTIC": "1",
                                                          "DTLAUNCH_WORKER": str(w.id)}}
            for w in self.members.values() if w.slot.host == host}
        plan: dict[str, object] = {"gen": self.gen, "ranks": ranks, "end": self.finished}
        if host in self.notify:
            plan["notify"] = list(self.notify[host])
        return plan

    def _exit(self, method: bytes, key: str, body: bytes) -> tuple[int, bytes]:
        parts = key.split(":")
        if method != b"PUT" or len(parts) != 3 or not all(p.isdigit() for p in parts[1:]):
            return 400, b""
        host, local_rank, wid = parts[0], int(parts[1]), int(parts[2])
        text = body.decode("ascii", "replace").strip()
        code = int(text) if text.lstrip("-").isdigit() else 1
        with self._cond:
            worker = self.members.get((host, local_rank))
            if worker is None or worker.id != wid or self.hosts.is_blacklisted(host):
                return 200, b""  # drained, or an earlier round's: not this round's business
            self._record_locked((host, local_rank), SUCCESS if code == 0 else FAILURE, code)
        return 200, b""

    # --- discovery and the agents -----------------------------------------------------------

    def _discovery_loop(self) -> None:
        while not self.finished:
            time.sleep(DISCOVER_EVERY)
            try:
                found = self.discover()
            except Exception as exc:  # whatever one call met, discovery goes on
                why = exc if isinstance(exc, DiscoveryError) else f"{type(exc).__name__}: {exc}"
                self.say("warning", f"elastic: host discovery failed, keeping the last hosts: {why}")
                continue
            self._take_discovery(found)

    def _take_discovery(self, found: Mapping[str, int], first: bool = False) -> None:
        # New hosts are checked (`admit`, a pre-flight each) only while the job needs more
        # slots for --max-np, in the order they are listed: thousands listed are not all
        # checked, one after another, to run two ranks. The others wait, unchecked and unused.
        wanted = self.spec.max_np
        have = sum(n for h, n in found.items()
                   if h in self.admitted and not self.hosts.is_blacklisted(h))
        unchecked = set()
        for host, slots in found.items():
            if host in self.admitted or host in self.hosts.refused:
                continue
            if wanted is not None and have >= wanted:
                unchecked.add(host)
                continue
            why = self.admit(host)
            if why is None:
                self.admitted.add(host)
                have += slots
            else:
                self.hosts.refused[host] = why
                self.say("warning", f"elastic: host {host} left out: {why}")
        with self._cond:
            self.hosts.unchecked = unchecked
            self.admitted.intersection_update(found)  # one that left is checked again on return
            update = self.hosts.update(found)
            if update != NO_UPDATE and not first and not self.finished:
                self._tell_coordinator_locked(update)
            self._cond.notify_all()

    def _tell_coordinator_locked(self, update: int) -> None:
        enough = self.hosts.available_slots() >= self.spec.min_np
        upcoming = assign(self.hosts.available(), self.spec.max_np) if enough else []
        current = [w.slot.host for w in sorted(self.members.values(), key=lambda w: w.slot.rank)]
        if upcoming == current:
            return
        coordinator = next((w for w in self.members.values() if w.slot.rank == 0), None)
        if coordinator is None:
            return
        self.last_ts = max(self.last_ts + 1, int(time.time()))
        self.notify[coordinator.slot.host] = (self.last_ts, update, coordinator.slot.local_rank)
        self.gen += 1
        what = "removed" if update == REMOVED else "added" if update == ADDED else "changed"
        self.say("note", f"elastic: hosts {what}; the ranks reset at their next commit")

    def _watch_agents(self) -> None:
        while not self.finished:
            time.sleep(1.0)
            with self._cond:
                now = self.clock()
                for host, heard in list(self.agents.items()):
                    if now - heard > LOST_AFTER:
                        self._lose_locked(host, f"its agent has not been heard from for "
                                                f"{LOST_AFTER:g} s")

    def host_lost(self, host: str) -> None:
        """The link to a host's agent is gone (its ssh ended)."""
        with self._cond:
            self._lose_locked(host, "the SSH connection to it was lost")

    def _lose_locked(self, host: str, why: str) -> None:
        if host not in self.agents or self.finished:
            return
        del self.agents[host]
        lost = [k for k in self.members if k[0] == host]
        if lost:
            self.say("warning", f"elastic: host {host} lost: {why}")
        for key in lost:
            self._record_locked(key, FAILURE, 1)
