"""A rank for the --max-restarts tests: records which attempt it ran in, then behaves as told.

Writes OUT/attempt<DTLAUNCH_RESTART_COUNT>.rank<rank> (its host). Modes: fail-once (rank 1
exits 3 in the first attempt), always-fail (rank 0 exits 1), hang-first (the first attempt's
ranks sleep until stopped), fail-slow (rank 0 exits 10 + the attempt's number after 2.5 s, so
no two attempts fail alike), kill-first (the first attempt's ranks print a line without its
end, then rank 1 kills itself with SIGKILL and the others wait to be stopped; later attempts
print `line <attempt> <rank>`), ok.
"""

import os
import signal
import socket
import sys
import time
from pathlib import Path

out, mode = Path(sys.argv[1]), sys.argv[2]
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("HOROVOD_RANK", "0"))
count = int(os.environ.get("DTLAUNCH_RESTART_COUNT", "-1"))
(out / f"attempt{count}.rank{rank}").write_text(f"{socket.gethostname()} {os.getpid()}\n")
if mode == "fail-once" and count == 0 and rank == 1:
    # Fail only once every rank has written its file (within a bound): the launcher then
    # stops the others, and one still starting would leave no trace of the first attempt.
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ.get("PMI_SIZE")
               or os.environ.get("HOROVOD_SIZE", "1"))
    deadline = time.monotonic() + 30
    while len(list(out.glob("attempt0.rank*"))) < size and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(3)
if mode == "always-fail" and rank == 0:
    sys.exit(1)
if mode == "hang-first" and count == 0:
    time.sleep(600)
if mode == "kill-first":
    if count == 0:
        sys.stdout.write(f"partial {count} {rank}")
        sys.stdout.flush()
        time.sleep(1)
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(600)
    print(f"line {count} {rank}")
if mode == "fail-slow" and rank == 0:
    time.sleep(2.5)
    sys.exit(10 + count)
