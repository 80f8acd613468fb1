"""Figure: the job's c10d store (agents/c10d_store.py, pure Python, admission on) against
PyTorch's own TCPStore server (libuv, no admission), no hosts.

Each server runs in a process of its own (the torch client holds the GIL while it waits, so a
server in the client's process would stall); one client process, PyTorch's own TCPStore
client, times 1000 set/get pairs (1000 round trips of GET plus WAIT, 1000 SETs) against each,
the two taking turns, one warm-up round dropped; medians and the ratio. Informational: the
store is used a few times per rank at start-up, not in the training loop.

    python bench/c10d_store.py [--reps 5] [--pairs 1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

OURS = f"""
import os, socket, sys
sys.path.insert(0, {str(ROOT)!r})
from dtlaunch.agents import c10d_store as cs
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(128)
server = cs.C10dStoreServer(listener, bytes(32), int(sys.argv[1])).start()
print(server.address[1], flush=True)
sys.stdin.read()
server.close()
"""

TORCHS = """
import datetime, sys
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=30))
print(store.port, flush=True)
sys.stdin.read()
"""

CLIENT = """
import datetime, sys, time
import torch.distributed as dist
pairs, reps = int(sys.argv[1]), int(sys.argv[2])
ports = [int(p) for p in sys.argv[3:]]
stores = [dist.TCPStore("127.0.0.1", p, is_master=False, timeout=datetime.timedelta(seconds=30))
          for p in ports]
for rep in range(reps + 1):
    for i, s in enumerate(stores if rep % 2 == 0 else stores[::-1]):
        t0 = time.perf_counter()
        for n in range(pairs):
            s.set("k%d" % n, b"v" * 64)
            s.get("k%d" % n)
        dt = time.perf_counter() - t0
        if rep:
            print(ports.index(s.port), dt, flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=1000)
    args = parser.parse_args()
    servers = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(os.getpid())],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for code in (OURS, TORCHS)]
    try:
        ports = [s.stdout.readline().strip() for s in servers if s.stdout]
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(CLIENT), str(args.pairs),
                              str(args.reps), *ports],
                             capture_output=True, text=True, timeout=600, check=True).stdout
    finally:
        for s in servers:
            s.kill()
            s.wait()
    times: dict[int, list[float]] = {0: [], 1: []}
    for line in out.splitlines():
        which, dt = line.split()
        times[int(which)].append(float(dt))
    ours, torchs = statistics.median(times[0]), statistics.median(times[1])
    print(f"{args.pairs} set/get pairs, median of {args.reps}:")
    print(f"  dtlaunch's c10d store (Python, admission on): {ours * 1000:.0f} ms")
    print(f"  PyTorch's TCPStore server (libuv):            {torchs * 1000:.0f} ms")
    print(f"  ratio: {ours / torchs:.2f} x")


if __name__ == "__main__":
    main()
