"""A rank for the console tests: prints where it runs, then one rank waits until every rank
has printed (a file each in OUT) and fails with a last line on stderr; the others sleep until
the launcher stops them.

    fail_after_all.py OUT RANK CODE
"""

import os
import socket
import sys
import time

out, failing, code = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ["PMI_RANK"])
size = int(os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ["PMI_SIZE"])
print(f"rank {rank} of {size} on {socket.gethostname()}", flush=True)
open(os.path.join(out, f"printed.{rank}"), "w").close()
if rank == failing:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and sum(
            name.startswith("printed.") for name in os.listdir(out)) < size:
        time.sleep(0.05)
    print(f"rank {rank}: giving up", file=sys.stderr, flush=True)
    sys.exit(code)
time.sleep(600)
