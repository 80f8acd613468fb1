"""--binding-args: binding and in-host mapping pass through; anything that moves ranks between
hosts is refused (dtlaunch must know each rank's host)."""

from __future__ import annotations

import pytest

from dtlaunch.core.errors import UsageError
from dtlaunch.job.binding import DEFAULT_BINDING, parse_binding_args


@pytest.mark.parametrize("words", [
    DEFAULT_BINDING,
    ("-bind-to", "core", "-map-by", "socket"),
    ("--bind-to", "core", "--map-by", "socket:PE=4", "--report-bindings"),
    ("-map-by", "slot:PE=2,oversubscribe", "-bind-to", "core:overload-allowed"),
    ("-bind-to", "none", "-map-by", "numa", "-rank-by", "core"),
    ("--cpus-per-proc", "4", "--use-hwthread-cpus", "-bind-to", "hwthread"),
])
def test_accepted_unchanged(words: tuple[str, ...]) -> None:
    assert parse_binding_args(words) == words


@pytest.mark.parametrize(("words", "message"), [
    ((), "empty"),
    (("-map-by", "node"), "-map-by node spreads ranks across hosts"),
    (("--map-by", "ppr:2:node"), "spreads ranks across hosts"),
    (("-map-by", "socket:span"), "modifier 'span' may change which host"),
    (("-rank-by", "node"), "spreads ranks across hosts"),
    (("-npernode", "2"), "-npernode changes which host runs each rank; .*-H host:N"),
    (("--rankfile", "ranks.txt"), "changes which host"),
    (("-np", "4"), "dtlaunch sets the hosts and -np itself"),
    (("-bind-to",), "-bind-to needs a value"),
    (("-bind-to", "-map-by", "slot"), "-bind-to needs a value"),
    (("--mca", "btl", "tcp"), "not a binding or mapping option; put other mpirun options in --mpi-args"),
    (("core",), "unexpected 'core'"),
])
def test_refused(words: tuple[str, ...], message: str) -> None:
    with pytest.raises(UsageError, match=message) as info:
        parse_binding_args(words)
    assert info.value.exit_code == 2
