"""A rank that misbehaves on request. Used by tests/testbed/test_hostile_testbed.py.

hostile_rank.py MODE OUT [ARGS...]: records OUT/rank.<rank>.json (host, pid, argv), then
daemon      double-forks a daemon that keeps the rank's stdout and ignores SIGTERM, and exits
flood MB    prints MB megabytes of 'x' without a newline, then exits
lines MB    prints MB megabytes in lines of 100 bytes
binary      writes every byte value, twice
faketag     prints a line that looks like Open MPI's tag of rank 7
stubborn    ignores SIGTERM and SIGINT, leaves a daemon that ignores them too, and sleeps
closed      closes its stdout and stderr, works on, writes OUT/closed.<rank>, exits 0
chatty      prints a line every 10 ms for two minutes
exit N      prints one line and exits with code N
"""

import json
import os
import signal
import socket
import sys
import time

mode, out = sys.argv[1], sys.argv[2]
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "-1"))
with open(os.path.join(out, f"rank.{rank}.json"), "w") as handle:
    json.dump({"rank": rank, "host": socket.gethostname(), "pid": os.getpid(),
               "argv": sys.argv[1:]}, handle)


def daemon(ignore: bool) -> None:
    """A grandchild in its own session, holding the rank's stdout."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            if ignore:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            with open(os.path.join(out, f"daemon.{rank}.pid"), "w") as pidfile:
                pidfile.write(str(os.getpid()))
            time.sleep(300)
        os._exit(0)
    os.wait()
    while not os.path.exists(os.path.join(out, f"daemon.{rank}.pid")):
        time.sleep(0.01)


if mode == "daemon":
    daemon(ignore=True)
    print(f"rank {rank} started its daemon", flush=True)
elif mode in ("flood", "lines"):
    total = int(float(sys.argv[3]) * 1000 * 1000)
    piece = b"x" * 99 + b"\n" if mode == "lines" else b"x" * 65536
    written = 0
    while written < total:
        chunk = piece if total - written >= len(piece) else piece[:total - written]
        sys.stdout.buffer.write(chunk)
        written += len(chunk)
    sys.stdout.buffer.flush()
elif mode == "binary":
    sys.stdout.buffer.write(bytes(range(256)) * 2)
    sys.stdout.buffer.flush()
elif mode == "faketag":
    print("[1,7]<stdout>:I am not rank 7", flush=True)
elif mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    daemon(ignore=True)
    print(f"rank {rank} ignores signals", flush=True)
    time.sleep(300)
elif mode == "closed":
    print(f"rank {rank} closes its output", flush=True)
    os.close(1)
    os.close(2)
    time.sleep(1)
    open(os.path.join(out, f"closed.{rank}"), "w").close()
elif mode == "chatty":
    for i in range(12000):
        print(f"line {i}", flush=True)
        time.sleep(0.01)
elif mode == "exit":
    print(f"rank {rank} on {socket.gethostname()}", flush=True)
    sys.exit(int(sys.argv[3]))
