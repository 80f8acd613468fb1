"""The rank shim: every rank starts as this small program, which runs the user's program.

Why a shim: the MPI launcher never sees the program's arguments (they travel encoded as one
word, so `prog.py --sep : -np 1 /bin/echo X` cannot be read as MPI syntax), and what each rank
prints comes back as records that say which rank and host wrote them, whatever the MPI does
to the stream. It also ends what a rank leaves behind (a double-forked daemon) and dies with
its MPI daemon.

How it reaches the hosts: inline, `python -I -S -c <this file, compressed> <encoded argv>`
(see `wrap_program`), so dtlaunch need not be installed where the ranks run. This module
therefore uses the standard library only (no dtlaunch imports) and stays valid Python 3.7.
Every rank pays its start-up before the program's own, so it imports only what it needs (no
`typing`, `json`, `base64`, `re`, `subprocess`, `contextlib` or `signal`'s enum wrapper at run
time; the program is started with fork and exec): about 20 ms of CPU per rank, not 65. On one
machine holding 128 ranks (a test bed) that is seconds.

Records, one per line (protocol version 2; the payload is escaped, not encoded):

    \\x1edtl2 <rank> <kind> <escaped payload>\\n

kinds: `h` the host's name (sent first), `o`/`e` a chunk of the program's stdout/stderr,
sent as soon as it is read (binary-safe, no waiting for a newline), `x` the program's end
(`exit N` or `signal N`, then ` @SECONDS`: when it ended, time.time() here), `n` the
program could not be started (its name). Escaping touches
three bytes only: ESC (0x10) becomes ESC `0`, `\\n` ESC `1` and `[` ESC `2`, so a payload
holds no newline (a record is one line) and no `[` (a rank's own text can never pass for a
launcher's tag, Open MPI's `[1,7]<stdout>:` or Hydra's `[7] `), and text stays as it was.

Record size: a launcher that tags each rank's output (Open MPI's `--tag-output`) lets the
reader join a rank's pieces exactly, so records there are as large as one read of the
program's output (`record_limit` of `wrap_program`, few writes, little CPU). A launcher that
does not tag needs each record to be one atomic write: at most PIPE_BUF bytes, the default.
"""

from __future__ import annotations  # no annotation is evaluated at run time

# ruff: noqa: SIM105  (try/except/pass here: contextlib would cost every rank its import)
import binascii
import os
import select
import sys
import time
import zlib

try:  # the C module itself: `signal` adds enums, which cost every rank ~5 ms to import
    import _signal as signal
except ImportError:  # not CPython
    import signal  # type: ignore[no-redef]

TYPE_CHECKING = False  # the checkers' name for it: the typing module is never imported here
if TYPE_CHECKING:
    from typing import Callable, Dict, List, NoReturn, Optional, Sequence, Tuple

# The words the rest of dtlaunch shares with this agent (through dtlaunch.agents).
__all__ = ["ESC", "EXIT", "HEADER_MAX", "HOST", "MAGIC", "NOSTART", "PIPE_BUF", "STDERR", "STDOUT",
           "encode_argv", "unescape"]

MAGIC = b"\x1edtl2 "
PIPE_BUF = 4096  # Linux's; POSIX guarantees 512, and every record here fits Linux's
HEADER_MAX = 40  # MAGIC, a rank, a kind and the spaces
MIN_RECORD = 256  # a smaller record_limit is raised to this
READ_SIZE = 1 << 16  # one read of the program's output
ESC = b"\x10"
_ESCAPES = ((ESC, ESC + b"0"), (b"\n", ESC + b"1"), (b"[", ESC + b"2"))
HOST, STDOUT, STDERR, EXIT, NOSTART = "h", "o", "e", "x", "n"
# DTLAUNCH_WORKER: an elastic job's worker number, which outlives its changing rank.
RANK_VARIABLES = ("DTLAUNCH_WORKER", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID",
                  "HOROVOD_RANK", "RANK")
GRACE = 0.8  # seconds a signalled rank gets before SIGKILL (Open MPI's own SIGKILL comes at 1 s)
LEFTOVER_GRACE = 1.0  # seconds a process left behind by an exited rank gets before SIGKILL
DRAIN = 0.3  # seconds to read what is left in the pipes once nothing holds them
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


# --- both sides: encoding ---------------------------------------------------------------------


_BASE64 = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")


def encode_argv(program: Sequence[str]) -> str:
    """The program's argv as one word of base64: its arguments in UTF-8 (lone surrogates
    survive) joined by NUL, the one byte no argument of an exec can hold."""
    if not program or any("\0" in arg for arg in program):
        raise ValueError("a program's argv is not empty and holds no NUL")
    data = b"\0".join(arg.encode("utf-8", "surrogatepass") for arg in program)
    return binascii.b2a_base64(data).decode("ascii").rstrip("\n")


def decode_argv(word: str) -> List[str]:
    if not word or not _BASE64.issuperset(word):
        raise ValueError("not a program's argv")
    try:
        data = binascii.a2b_base64(word.encode("ascii"))
    except binascii.Error:
        raise ValueError("not a program's argv") from None
    return [arg.decode("utf-8", "surrogatepass") for arg in data.split(b"\0")]


def escape(data: bytes) -> bytes:
    for raw, escaped in _ESCAPES:  # ESC first: the escapes made next hold one
        if raw in data:
            data = data.replace(raw, escaped)
    return data


def unescape(data: bytes) -> bytes:
    """The inverse of `escape`. Every ESC starts a pair (a raw one was escaped), so each pair
    is found by its own replace; ESC `0` goes last, or ESC `0` `1` would become a newline."""
    if ESC not in data:
        return data
    for raw, escaped in reversed(_ESCAPES):
        data = data.replace(escaped, raw)
    return data


def records(rank: int, kind: str, payload: bytes, limit: int = PIPE_BUF) -> List[bytes]:
    """`payload` as records of at most `limit` bytes each (never an escape pair cut in two)."""
    head = b"%s%d %s " % (MAGIC, rank, kind.encode("ascii"))
    body = escape(payload)
    room = max(limit, MIN_RECORD) - len(head) - 1
    out = []
    start = 0
    while True:
        end = min(start + room, len(body))
        if body[end - 1:end] == ESC and end < len(body):
            end -= 1
        out.append(b"".join((head, body[start:end], b"\n")))
        start = end
        if start >= len(body):
            return out


def wrap_program(program: Sequence[str], python: str,
                 record_limit: int = PIPE_BUF) -> Tuple[str, ...]:
    """The argv the MPI launches instead of `program`: this shim, inline, with `python`;
    its records at most `record_limit` bytes (see the module's docstring).

    It travels twice: as byte code, which an interpreter of dtlaunch's own bytecode version
    runs at once, and as source for any other (compiling it cost every rank ~5 ms of CPU)."""
    return (python, "-I", "-S", "-c", _boot(), str(max(record_limit, MIN_RECORD)),
            encode_argv(program))


_BOOT: List[str] = []


def _byte_code(source: bytes) -> bytes:
    """This file's byte code, marshalled: the import system's own (its cached .pyc, read, not
    compiled again: ~6 ms per job) when this interpreter runs unoptimised, else compiled here
    (an -O interpreter's .pyc would have lost the asserts)."""
    import marshal

    spec = globals().get("__spec__")
    loader = getattr(spec, "loader", None)
    if not sys.flags.optimize and spec is not None and loader is not None \
            and hasattr(loader, "get_code"):
        try:
            code = loader.get_code(spec.name)
        except (ImportError, OSError, SyntaxError, ValueError):
            code = None
        if code is not None:
            return marshal.dumps(code)
    return marshal.dumps(compile(source, "<string>", "exec", dont_inherit=True, optimize=0))


def _boot() -> str:
    if not _BOOT:
        # The byte code's version, read where the rank reads it (importlib.util, which
        # names the same value, is one more import on the launch path).
        magic = sys.modules["_frozen_importlib_external"].MAGIC_NUMBER
        with open(__file__, "rb") as handle:
            source = handle.read()
        code = _byte_code(source)

        def packed(data: bytes) -> str:
            # zlib's default level: 9 took 5 ms more per job for 1 % less.
            return binascii.b2a_base64(zlib.compress(data)).decode("ascii").rstrip("\n")

        # One line, as before: no launcher has to carry a newline inside an argument.
        _BOOT.append(
            "import binascii,marshal,sys,zlib;"
            "e=sys.modules.get('_frozen_importlib_external');"
            "c=getattr(e,'MAGIC_NUMBER',None)==%r and "
            "marshal.loads(zlib.decompress(binascii.a2b_base64('%s')));"
            "exec(c or zlib.decompress(binascii.a2b_base64('%s')))"
            % (magic, packed(code), packed(source)))
    return _BOOT[0]


# --- the rank's side ----------------------------------------------------------------------------


def _prctl(option: int, value: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError, ImportError):
        pass  # not Linux: no subreaper and no death signal, the rest still works


def _spawn(program: List[str], keep: Tuple[int, ...]) -> Tuple[int, Tuple[int, int]]:
    """Start the program (what subprocess.Popen would do, without importing it): stdin from
    /dev/null, stdout and stderr into pipes, `keep` inherited, every other descriptor closed.
    Returns its pid and the pipes' read ends; raises OSError when it cannot be started."""
    out_r, out_w = os.pipe()  # os.pipe's descriptors close on exec
    err_r, err_w = os.pipe()
    fail_r, fail_w = os.pipe()  # closes on a successful exec; carries errno otherwise
    null = os.open(os.devnull, os.O_RDONLY)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            # Its own process group (a signal reaches it once, from the shim), and death
            # with the shim, even by SIGKILL.
            os.setpgid(0, 0)
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            # What the shim ignores (SIGPIPE) the program must not inherit, as Popen's
            # restore_signals does.
            for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ"):
                if hasattr(signal, name):
                    signal.signal(getattr(signal, name), signal.SIG_DFL)
            os.dup2(null, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for fd in keep:
                os.set_inheritable(fd, True)
            # What the MPI daemon left inheritable stays with the shim, not the program. The
            # open ones from /proc (a loop up to the limit could be a million calls), or every
            # number below a small limit where /proc is missing.
            try:
                fds = [int(name) for name in os.listdir("/proc/self/fd")]
            except OSError:
                fds = list(range(3, 1024))
            for fd in fds:
                if fd > 2 and fd not in keep and fd != fail_w:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            os.execvp(program[0], program)
        except OSError as exc:
            code = exc.errno or 0
        finally:
            try:
                os.write(fail_w, str(code).encode("ascii"))
            finally:
                os._exit(127)
    for fd in (out_w, err_w, fail_w, null):
        os.close(fd)
    failed = b"".join(iter(lambda: os.read(fail_r, 32), b""))
    os.close(fail_r)
    if failed:
        os.waitpid(pid, 0)
        os.close(out_r)
        os.close(err_r)
        code = int(failed) if failed.isdigit() else 0
        raise OSError(code, os.strerror(code))
    return pid, (out_r, err_r)


def _descendants(root: int) -> List[int]:
    """Every live process below `root`, read from /proc (orphans are reparented to the shim,
    which is their subreaper, so the tree holds everything the program left). From each
    thread's `children` file where the kernel has them: they read the few processes of the
    tree, where a scan reads every process on the machine (hundreds on a node with many ranks,
    each rank's shim reading them all more than once)."""
    children_of: Callable[[int], List[int]]
    if os.path.exists("/proc/%d/task/%d/children" % (root, root)):
        children_of = _live_children
    else:
        children_of = _scanned_children()
    found = [root]
    for pid in found:  # grows as it goes: breadth first
        found.extend(children_of(pid))
    return found[1:]


def _live_children(pid: int) -> List[int]:
    """`pid`'s live children, from its threads' `children` files."""
    kids: List[int] = []
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return kids  # gone meanwhile
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/children" % (pid, tid), "rb") as handle:
                kids += [int(k) for k in handle.read().split()]
        except (OSError, ValueError):
            continue
    return [kid for kid in kids if _live_stat(kid) is not None]


def _scanned_children() -> Callable[[int], List[int]]:
    """Each live process's children, from one scan of every process in /proc (none where
    /proc cannot be read)."""
    children: Dict[int, List[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        names = []
    for name in names:
        fields = _live_stat(name) if name.isdigit() else None
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(name))
    return lambda pid: children.get(pid, [])


def _live_stat(pid: object) -> Optional[List[bytes]]:
    """The fields of /proc/PID/stat after the name (state, parent, ...); None for a zombie or
    a process gone."""
    try:
        with open("/proc/%s/stat" % pid, "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if fields and fields[0] != b"Z" else None


def _kill(pids: List[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:
            pass


class Shim:
    def __init__(self, program: List[str], rank: int, out_fd: int = 1,
                 record_limit: int = PIPE_BUF) -> None:
        self.program = program
        self.record_limit = record_limit
        self.rank = rank
        self.out_fd = out_fd
        self.signals: List[int] = []
        self.status: Optional[int] = None  # the program's wait status
        self.ended_at = 0.0  # when the program ended (time.time()), for the exit record
        self.pid: Optional[int] = None  # the program's
        self.pipes: Tuple[int, ...] = ()  # its stdout's and stderr's read ends
        self.out_broken = False

    def send(self, kind: str, payload: bytes) -> None:
        if self.out_broken:
            return
        try:
            for one in records(self.rank, kind, payload, self.record_limit):
                # Open MPI gives a rank a pty, and a tty write that a signal (our SIGCHLD)
                # interrupts returns what it wrote so far: write the rest.
                data = memoryview(one)
                while data:
                    data = data[os.write(self.out_fd, data):]
        except OSError:
            # The MPI daemon is gone: nobody reads us any more; stop the program.
            self.out_broken = True
            self.signals.append(signal.SIGTERM)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signals.append(signum)

    def start(self) -> Optional[int]:
        """Start the program; returns an exit code when it cannot be started."""
        # Descriptors the process manager hands each rank by number (Hydra's PMI_FD): the
        # program inherits them, and the shim keeps its copy open, so that the program's end is
        # told by its exit record rather than by the connection closing (which Hydra answers
        # by killing us).
        pmi = os.environ.get("PMI_FD", "")
        try:
            self.pid, self.pipes = _spawn(self.program, (int(pmi),) if pmi.isdigit() else ())
        except OSError as exc:
            why = exc.strerror or str(exc)
            self.send(STDERR, ("dtlaunch: cannot run %s: %s\n" % (self.program[0], why))
                      .encode("utf-8", "surrogateescape"))
            self.send(NOSTART, self.program[0].encode("utf-8", "surrogateescape"))
            return 126 if isinstance(exc, PermissionError) else 127
        return None

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.pid:
                self.status = status
                self.ended_at = time.time()

    def _signal_program(self, signum: int) -> None:
        assert self.pid is not None
        if self.status is None:
            try:
                os.killpg(self.pid, signum)
            except OSError:
                pass
        _kill(_descendants(os.getpid()), signal.SIGTERM if signum == signal.SIGINT else signum)

    def run(self) -> int:
        """Forward output until the program has ended and nothing it started is left."""
        assert self.pid is not None and len(self.pipes) == 2
        wake_r, wake_w = os.pipe()
        for fd in (wake_r, wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wake_w)
        streams = {self.pipes[0]: STDOUT, self.pipes[1]: STDERR}
        kill_at: Optional[float] = None  # when what is left gets SIGKILL
        drain_until: Optional[float] = None
        handled = 0
        while True:
            self._reap()
            now = time.monotonic()
            if handled < len(self.signals):
                signum = self.signals[handled]
                handled = len(self.signals)
                self._signal_program(signum)
                if kill_at is None or kill_at > now + GRACE:
                    kill_at = now + GRACE
            if self.status is not None:
                left = _descendants(os.getpid())
                if left and kill_at is None:
                    self._read(streams, 0)  # what the program wrote before it exited
                    _kill(left, signal.SIGTERM)
                    kill_at = now + LEFTOVER_GRACE
                if not left:
                    # Nothing of the program's is left, so its pipes end soon; only a process
                    # outside (one given the pipe) could keep them open: wait for it briefly.
                    drain_until = drain_until or now + DRAIN
                    if not streams or now >= drain_until:
                        break
            if kill_at is not None and now >= kill_at:
                if self.status is None:
                    self._signal_program(signal.SIGKILL)
                _kill(_descendants(os.getpid()), signal.SIGKILL)
            # SIGCHLD and the signals wake the select; the timeout only paces the endgame.
            wait = 1.0 if kill_at is None and drain_until is None else 0.1
            if drain_until is not None:
                wait = max(0.0, min(wait, drain_until - now))
            if self._read(streams, wait, wake_r) and drain_until is not None:
                drain_until = time.monotonic() + DRAIN  # still coming: read on
        signal.set_wakeup_fd(-1)
        return self.status if self.status is not None else 0

    def _read(self, streams: Dict[int, str], wait: float, wake: int = -1) -> bool:
        """Pass on what the program wrote; True when there was something."""
        fds = list(streams) + ([wake] if wake >= 0 else [])
        ready = select.select(fds, [], [], wait)[0]  # a signal's EINTR is retried (PEP 475)
        got = False
        for fd in ready:
            if fd == wake:
                try:
                    os.read(fd, 512)
                except OSError:
                    pass
                continue
            data = os.read(fd, READ_SIZE)
            if not data:
                del streams[fd]
                os.close(fd)
                continue
            got = True
            self.send(streams[fd], data)
        return got


def _die_like(status: int) -> NoReturn:
    """Exit as the program did: with its code, or killed by the same signal."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the program's core, not ours
        except (ImportError, ValueError, OSError):
            pass
        try:
            signal.signal(signum, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL has no handler to reset
            pass
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)  # a signal whose default is not to die
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def recorded_error(path: Optional[str]) -> Optional[str]:
    """What torch's `@record` wrote for a failed worker (TORCHELASTIC_ERROR_FILE), one line."""
    if not path:
        return None
    import json

    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(1 << 20).decode("utf-8", "replace"))
        message = data["message"]
        text = message.get("message") if isinstance(message, dict) else message
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return " ".join(str(text).split()) or None


def main(argv: List[str]) -> None:
    try:
        program = decode_argv(argv[-1])
        limit = int(argv[-2]) if len(argv) > 2 and argv[-2].isdigit() else PIPE_BUF
    except (ValueError, IndexError):
        sys.stderr.write("dtlaunch rank shim: expected the program's encoded argv\n")
        os._exit(2)
    ppid = os.getppid()
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != ppid:  # the daemon died before the death signal was set
        os._exit(1)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    rank = next((int(os.environ[n]) for n in RANK_VARIABLES if os.environ.get(n, "").isdigit()), -1)
    shim = Shim(program, rank, record_limit=max(limit, MIN_RECORD))
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, shim._on_signal if signum != signal.SIGCHLD else lambda *a: None)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    shim.send(HOST, (os.environ.get("PMIX_HOSTNAME") or os.uname().nodename).encode())
    code = shim.start()
    if code is not None:
        shim.send(EXIT, b"exit %d @%.3f" % (code, time.time()))
        os._exit(code)
    status = shim.run()
    failed = os.WIFSIGNALED(status) or (os.WIFEXITED(status) and os.WEXITSTATUS(status))
    recorded = recorded_error(os.environ.get("TORCHELASTIC_ERROR_FILE")) if failed else None
    if recorded:  # a torch worker's @record: its exception, as its last line
        shim.send(STDERR, b"torch.distributed.elastic's error file (@record): %s\n"
                  % recorded.encode("utf-8", "replace")[:4096])
    if os.WIFSIGNALED(status):
        end = b"signal %d" % os.WTERMSIG(status)
    else:
        end = b"exit %d" % (os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)
    # The time the program ended, not the time its output was drained: what orders the
    # failures of a job ("the first in time").
    shim.send(EXIT, end + b" @%.3f" % (shim.ended_at or time.time()))
    _die_like(status)


if __name__ == "__main__":
    main(sys.argv)
