"""What runs on the hosts (and beside mpirun here): each a file of its own, shipped as it is.

They run under whatever interpreter and shell the host has: the Python files keep to the
oldest Python each runs under and the standard library, and import nothing from dtlaunch;
the shell files keep to POSIX sh (tests/unit/test_layers.py holds them to it, OLDEST_PYTHON).

What each does and how it travels is said once, in SHIPPING, and `ship(name)` is the one way
the rest of dtlaunch starts or sends an agent (tests/unit/test_layers.py: no other), besides
the few words (record kinds, environment names) each agent defines and lists in its `__all__`:

- HERE: run on this machine from its file, `python -I -S FILE` (beside mpirun: rsh, lifeline,
  the Gloo fan-out);
- TEXT: its text travels inside the command, `sh -c TEXT` or as an argument of the probe (the
  probe's parts, the ties), so nothing has to be on the host first;
- STDIN: a fixed bootstrap on the command line, its text on standard input (the Gloo host
  agent, whose job follows it there, secrets included);
- INLINE: compressed into `python -c` on the command line (the rank shim: mpirun starts it on
  the host, where nothing of dtlaunch's is).
"""

from __future__ import annotations  # no annotation is evaluated at run time

import collections
import functools
import importlib
import os
import sys

TYPE_CHECKING = False  # the checkers' name for it, without importing `typing` (~15 ms)
if TYPE_CHECKING:
    from typing import Any, List, Sequence, Tuple

    # What the checkers see: each agent's words (its `__all__`), with their types.
    from .gloo_host import *  # noqa: F403
    from .lifeline import *  # noqa: F403
    from .rank_shim import *  # noqa: F403
    from .remote_probe import *  # noqa: F403
    from .rsh import *  # noqa: F403

# The agents whose words (each one's `__all__`) the rest of dtlaunch imports from here, the
# lightest first: gloo_host (tens of ms) is read only for its own words. Each is loaded on first
# use, not here: `python -m dtlaunch.agents.rsh` must find its module not yet imported.
_SPEAKERS = ("lifeline", "remote_probe", "rank_shim", "rsh", "gloo_host")


if not TYPE_CHECKING:  # hidden from the checkers, who would let any name through it

    def __getattr__(name: str) -> Any:
        for agent in _SPEAKERS:
            module = importlib.import_module(f"{__name__}.{agent}")
            if name in module.__all__:
                return getattr(module, name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The shell that runs a shell agent on this machine.
LOCAL_SHELL = "/bin/sh" if os.path.exists("/bin/sh") else (__import__("shutil").which("sh") or "sh")


HERE, TEXT, STDIN, INLINE = "here", "text", "stdin", "inline"
# How each agent travels: one line per agent file (tests/unit/test_layers.py).
SHIPPING = {
    "rsh.py": HERE,  # the MPI launcher's ssh agent; says which host's link was lost
    "lifeline.py": HERE,  # ends the job when dtlaunch dies, even by SIGKILL
    "gloo_start.py": HERE,  # the launcher of Gloo and torch jobs: one agent per host, output joined
    "gloo_host.py": STDIN,  # a Gloo job's agent on each host: starts its ranks, signs their rendezvous
    "torch_host.py": STDIN,  # a torch job's agent on each host: its workers, host 0's c10d store
    # A torch job's c10d store (admits only the job's processes) and the other hosts' side
    # that vouches for their sockets: its text, joined to the torch host agent's on its stdin.
    "c10d_store.py": TEXT,
    "rank_shim.py": INLINE,  # every rank starts as it: runs the user's program, its output as records
    "probe.sh": TEXT,  # the probe doctor and the pre-flight run on each host, with the next two
    "remote_probe.py": TEXT,
    "import_probe.py": TEXT,
    "tied.sh": TEXT,  # a remote command tied to the life of its connection
    "proxy_tied.sh": TEXT,  # a ProxyCommand tied to the life of its connection
}


# An agent that builds on others travels as one text, theirs first (the torch host agent's,
# on its stdin, holds all three).
JOINED = {"torch_host.py": ("gloo_host.py", "c10d_store.py"), "c10d_store.py": ("gloo_host.py",)}
FUTURE = "from __future__ import annotations"


def _path(name: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), name)


@functools.cache
def _text(name: str) -> str:
    # A plain read, not importlib.resources: the local probe's thread reads agents while
    # others connect, and a first import of importlib.resources there could race theirs.
    with open(_path(name), encoding="utf-8") as f:
        return f.read()


class Shipment(collections.namedtuple("Shipment", ["name", "how"])):
    """One agent (`name`) and the way it travels (`how`, its SHIPPING); each method is for its
    own way only."""

    __slots__ = ()

    def _only(self, how: str) -> None:
        if self.how != how:
            raise ValueError(f"{self.name} travels {self.how}, not {how}")

    @property
    def file(self) -> str:
        """HERE: the file run on this machine (never copied)."""
        self._only(HERE)
        return _path(self.name)

    def here(self, python: str = sys.executable) -> List[str]:
        """HERE: the argv that runs it on this machine (no site, no environment)."""
        return [python, "-I", "-S", self.file]

    @property
    def text(self) -> str:
        """TEXT: the text that travels in the command."""
        self._only(TEXT)
        return _text(self.name)

    def shell(self, shell: str, label: str) -> List[str]:
        """TEXT, a shell agent: `shell -c TEXT LABEL` (arguments follow)."""
        return [shell, "-c", self.text, label]

    def stdin(self, python: str) -> Tuple[List[str], bytes]:
        """STDIN: the bootstrap argv, and the first line of its standard input: its text (after
        the texts it builds on, JOINED), compressed, as one line of base64."""
        self._only(STDIN)
        import binascii
        import zlib

        parts = [_text(part) for part in (*JOINED.get(self.name, ()), self.name)]
        # One module: the later texts' own `from __future__` line may only come first.
        text = parts[0] + "".join(p.replace(FUTURE, "", 1) for p in parts[1:])
        module = "dtlaunch_" + self.name.rsplit(".", 1)[0]
        boot = ("import sys,zlib,binascii;s=sys.stdin.buffer;"
                "exec(compile(zlib.decompress(binascii.a2b_base64(s.readline())),"
                f"'{module}','exec'),{{'__name__':'{module}','STREAM':s}})")
        packed = binascii.b2a_base64(zlib.compress(text.encode("utf-8"), 9))
        return [python, "-I", "-S", "-c", boot], packed

    def inline(self, program: Sequence[str], python: str, record_limit: int) -> Tuple[str, ...]:
        """INLINE: the argv that runs `program` under it, all on the command line."""
        self._only(INLINE)
        agent = importlib.import_module(f"{__name__}.rank_shim")  # loaded on first use
        argv: Tuple[str, ...] = agent.wrap_program(program, python, record_limit)
        return argv


def ship(name: str) -> Shipment:
    """The agent `name` (a file of this folder) and how it travels."""
    return Shipment(name, SHIPPING[name])
