"""`--ranks SPEC` and torchrun's `--local-ranks-filter`: which ranks' output the console shows.
Pure: the spec is read here, and resolved against the job's ranks once they are known.

SPEC is a comma list of items: a rank (`0`), a range (`3-5`), `last` (the highest rank) or
`all`. With `local` the numbers are local ranks (a rank's index among the ranks of its host),
as torchrun's `--local-ranks-filter` reads them: `0` is the first rank on every host.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from dtlaunch.core.errors import UsageError

_ITEM = re.compile(r"(\d{1,9})(?:-(\d{1,9}))?")


@dataclass(frozen=True)
class RankFilter:
    """The ranks to show. `ranks`: exact numbers, `spans`: inclusive ranges, `last`: the
    highest rank, `everything`: `all`. `local`: the numbers are local ranks."""

    ranks: frozenset[int] = frozenset()
    spans: tuple[tuple[int, int], ...] = ()
    last: bool = False
    everything: bool = False
    local: bool = False
    spec: str = ""  # as typed, for messages

    def _holds(self, number: int) -> bool:
        return number in self.ranks or any(lo <= number <= hi for lo, hi in self.spans)

    def shown(self, rank_hosts: Sequence[str]) -> frozenset[int]:
        """The ranks (of a job with these hosts, rank -> host) whose output is shown."""
        # With `local` a rank's number is its index among its host's ranks, and `last` the
        # highest of them; else the job is one group, numbered by rank.
        groups = tuple(rank_hosts) if self.local else ("",) * len(rank_hosts)
        size = Counter(groups)
        seen: Counter[str] = Counter()
        picked: set[int] = set()
        for rank, group in enumerate(groups):
            number = seen[group]
            seen[group] += 1
            if self.everything or self._holds(number) or (self.last and number == size[group] - 1):
                picked.add(rank)
        return frozenset(picked)

    def unused(self, rank_hosts: Sequence[str]) -> str | None:
        """A note when the spec names no rank of this job at all (`--ranks 9` on 4 ranks)."""
        if self.shown(rank_hosts):
            return None
        option, what = ("--local-ranks-filter", "local rank") if self.local else ("--ranks", "rank")
        return (f"{option} {self.spec}: the job has no such {what} "
                f"({len(rank_hosts)} rank(s)); only failures will be shown")


def parse_rank_filter(spec: str, *, local: bool = False) -> RankFilter:
    """`0`, `0,3-5`, `last`, `all` (and for `local`, the same words for local ranks); a bad
    spec is one UsageError line."""
    option = "--local-ranks-filter" if local else "--ranks"
    words = [w.strip() for w in spec.split(",")]
    if not spec.strip() or any(not w for w in words):
        raise UsageError(f"{option} {spec!r}: expected ranks like 0 or 0,3-5 or last or all")
    ranks: set[int] = set()
    spans: list[tuple[int, int]] = []
    last = everything = False
    for word in words:
        lowered = word.lower()
        if lowered == "last":
            last = True
            continue
        if lowered == "all":
            everything = True
            continue
        match = _ITEM.fullmatch(word)
        if match is None:
            raise UsageError(f"{option} {spec!r}: {word!r} is not a rank, a range A-B, "
                             "'last' or 'all'")
        low = int(match.group(1))
        if match.group(2) is None:
            ranks.add(low)
            continue
        high = int(match.group(2))
        if high < low:
            raise UsageError(f"{option} {spec!r}: the range {word} runs backwards")
        spans.append((low, high))
    return RankFilter(frozenset(ranks), tuple(spans), last, everything, local, spec)
