"""A rank that prints LINES numbered lines of 64 bytes, each naming the rank that wrote it (from
the MPI's environment), so a reader can check every line arrived under the right tag.

    print_lines.py LINES
"""

import os
import sys

rank = next((os.environ[v] for v in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
             if v in os.environ), "?")
out = sys.stdout.buffer
for i in range(int(sys.argv[1])):
    head = b"rank %s line %d " % (rank.encode(), i)
    out.write(head + b"x" * (63 - len(head)) + b"\n")
out.flush()
