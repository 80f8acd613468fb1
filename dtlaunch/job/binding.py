"""horovodrun's `--binding-args`: mpirun's binding and mapping options instead of dtlaunch's
`-bind-to none -map-by slot`. Pure code.

dtlaunch must know which host runs each rank (it tags output `[rank@host]` and names a failed
rank's host), and it computes that from the slots in slot order. So only options that keep
slot order are taken: binding (`-bind-to` anything), and mapping or ranking by an object inside
a host (slot, core, socket, numa, ...), which Open MPI still fills host by host up to each host's
slots (measured on the test bed with Open MPI 4.1). Options that spread ranks across hosts
(`-map-by node`, `:span`, `ppr:N:node`, `-npernode`, rankfiles) are refused with the fix:
place ranks with the slots in `-H host:N`.

Binding or mapping options given in `--mpi-args` instead replace the default they set
(`binding_for`), and every one of these options reaches Open MPI in its double-dash form.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from dtlaunch.core.errors import UsageError

DEFAULT_BINDING = ("-bind-to", "none", "-map-by", "slot")
# Objects inside one host: mapping or ranking by them keeps Open MPI's host-by-host order.
_IN_HOST = ("slot", "hwthread", "core", "l1cache", "l2cache", "l3cache", "socket", "numa", "board",
            "package")
# Compiled by the first modifier a user gives (re's cache).
_MAP_MODIFIER = (r"(?i)^(pe=\d+|pe-list=[\d,-]+|oversubscribe|nooversubscribe|display|"
                 r"displaydevel|inherit|noinherit|hwtcpus|fill)$")
_VALUE_OPTIONS = {"bind-to", "map-by", "rank-by", "cpus-per-proc", "cpus-per-rank", "cpu-list"}
_FLAGS = {"report-bindings", "use-hwthread-cpus", "bind-to-core", "bind-to-socket", "bind-to-none"}
_REFUSED = {"npernode", "npersocket", "pernode", "rankfile", "rf", "nolocal"}
_DTLAUNCH_SETS = {"host", "H", "np", "n", "hostfile", "machinefile"}
FIX = ("dtlaunch must know which host runs each rank; place ranks with the slots in -H host:N "
       "(filled in order)")


def _check_placement(option: str, value: str) -> None:
    head, *modifiers = re.split(r"[:,]", value)
    if head.lower() not in _IN_HOST:  # node, ppr and the like spread ranks across hosts
        raise UsageError(f"--binding-args: {option} {value} spreads ranks across hosts or is not "
                         f"known to keep slot order; {FIX}")
    mapping = option.endswith("map-by")
    bad = [m for m in modifiers if not (re.match(_MAP_MODIFIER, m) if mapping else m.lower() == "fill")]
    if bad:
        raise UsageError(f"--binding-args: {option} {value}: modifier {bad[0]!r} may change which "
                         f"host runs each rank; {FIX}")


def parse_binding_args(words: Sequence[str]) -> tuple[str, ...]:
    """Check `--binding-args` (already split) and return it for mpirun's line, unchanged."""
    if not words:
        raise UsageError("--binding-args: empty; give mpirun binding options, e.g. '-bind-to core'")
    i = 0
    while i < len(words):
        word = words[i]
        name = word.lstrip("-")
        if not word.startswith("-") or not name:
            raise UsageError(f"--binding-args: unexpected {word!r}; expected mpirun options such as "
                             "-bind-to core -map-by socket")
        if name in _DTLAUNCH_SETS:
            raise UsageError(f"--binding-args: {word}: dtlaunch sets the hosts and -np itself "
                             "(-H, --hostfile, -np)")
        if name in _REFUSED:
            raise UsageError(f"--binding-args: {word} changes which host runs each rank; {FIX}")
        if name in _FLAGS:
            i += 1
            continue
        if name not in _VALUE_OPTIONS:
            raise UsageError(f"--binding-args: {word} is not a binding or mapping option; put "
                             "other mpirun options in --mpi-args")
        if i + 1 >= len(words) or words[i + 1].startswith("-"):
            raise UsageError(f"--binding-args: {word} needs a value")
        if name in ("map-by", "rank-by"):
            _check_placement(word, words[i + 1])
        i += 2
    return tuple(words)


# Options that set what each of dtlaunch's defaults sets, old spellings included.
_SETS_BINDING = {"bind-to", "bind-to-core", "bind-to-socket", "bind-to-none"}
_SETS_MAPPING = {"map-by", "npernode", "pernode", "npersocket"}


def _sets(words: Sequence[str]) -> set[str]:
    """Which of dtlaunch's two defaults ("bind-to", "map-by") these options set."""
    names = {w.lstrip("-") for w in words if w.startswith("-")}
    return ({"bind-to"} if names & _SETS_BINDING else set()) | (
        {"map-by"} if names & _SETS_MAPPING else set())


def binding_for(mpi_args: Sequence[str], binding: Sequence[str] | None) -> tuple[str, ...]:
    """Binding and mapping options for mpirun's line: `--binding-args` when given, else
    dtlaunch's default less what `--mpi-args` sets itself. Open MPI 5's launcher refuses an
    option given twice ("listed more than once"), where Open MPI 4 took the last one, so the
    `--mpi-args '--bind-to core'` that horovodrun users write made the job fail under 5."""
    from_args = _sets(mpi_args)
    if binding is not None:
        both = from_args & _sets(binding)
        if both:
            raise UsageError(f"--mpi-args and --binding-args both set --{min(both)}; give it "
                             "once, in --binding-args")
        return tuple(binding)
    return tuple(word for option, value in zip(DEFAULT_BINDING[::2], DEFAULT_BINDING[1::2])
                 if option.lstrip("-") not in from_args for word in (option, value))


def double_dash(words: Sequence[str]) -> tuple[str, ...]:
    """The same options in the double-dash forms, which every Open MPI version accepts: Open
    MPI 5's launcher (PRRTE) refuses `-bind-to`, `-map-by` and the like, while horovodrun users
    write them with one dash. Values and anything else stay as they are."""
    known = _VALUE_OPTIONS | _FLAGS
    return tuple(f"-{w}" if w.startswith("-") and not w.startswith("--") and w[1:] in known
                 else w for w in words)


# Intel MPI's Hydra takes `-bind-to` and ignores it: it pins every rank to a core of its own
# unless told otherwise through I_MPI_PIN / I_MPI_PIN_DOMAIN (measured: `-bind-to none` left
# each rank on one CPU, `I_MPI_PIN=0` gave both CPUs to each).
_INTEL_DOMAIN = {"core": "core", "socket": "socket", "package": "socket", "board": "socket",
                 "numa": "numa", "hwthread": "1", "l2cache": "cache2", "l3cache": "cache3"}


def intel_pinning(binding: Sequence[str], mpi_args: Sequence[str] = ()) -> tuple[tuple[str, str], ...]:
    """`--binding-args` (checked by parse_binding_args) as the Intel MPI variables that do it:
    `-bind-to none` -> I_MPI_PIN=0, `-bind-to core` -> I_MPI_PIN_DOMAIN=core, and so on.
    A `-bind-to` in `mpi_args` would reach Intel's mpiexec as given, and be ignored: refused."""
    if any(w.lstrip("-").startswith("bind-to") for w in mpi_args if w.startswith("-")):
        raise UsageError("--mpi-args: Intel MPI's mpiexec takes -bind-to and ignores it; give it as "
                         "--binding-args '-bind-to ...', which dtlaunch turns into I_MPI_PIN_DOMAIN")
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(binding):
        name = binding[i].lstrip("-")
        if name.startswith("bind-to-"):
            value = name[len("bind-to-"):]
            i += 1
        elif name == "bind-to":
            value = binding[i + 1]
            i += 2
        else:
            raise UsageError(f"--binding-args: {binding[i]}: Intel MPI places and pins ranks itself; "
                             "dtlaunch translates only -bind-to (to I_MPI_PIN_DOMAIN); for the rest "
                             "set Intel's I_MPI_PIN_* variables with -x NAME=VALUE")
        head = value.split(":")[0].lower()
        if head == "none":
            out.append(("I_MPI_PIN", "0"))
        elif head in _INTEL_DOMAIN:
            out.append(("I_MPI_PIN_DOMAIN", _INTEL_DOMAIN[head]))
        else:
            raise UsageError(f"--binding-args: -bind-to {value}: no Intel MPI pin domain does that; "
                             f"use one of none, {', '.join(_INTEL_DOMAIN)}")
    return tuple(out)
