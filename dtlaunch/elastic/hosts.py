"""Which discovered hosts may take ranks, in which order, and what changed: horovodrun's
rules, pure (the clock and the random draw are passed in).

- Hosts keep the order they first appeared in, so the oldest hosts keep the lowest ranks (rank
  0, which holds the state the others are synced from, stays put while its host does).
- A host where a rank failed is blacklisted. With `--blacklist-cooldown-range LOW HIGH` it may
  come back after a cooldown that doubles with each failure (LOW * 2^n plus up to LOW at
  random, within [LOW, HIGH]); without it, never.
- A host dtlaunch refused to admit (its pre-flight failed) is left out until it leaves
  discovery and comes back; one not checked yet (not needed so far) is left out until it is.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from dtlaunch.job.hosts import MAX_NUM_PROC

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
