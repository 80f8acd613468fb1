"""A rank that prints many numbered lines fast, in uneven writes, to stdout and stderr."""

import os
import sys

rank = int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK") or 0)
lines = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
for i in range(lines):
    text = f"rank {rank} line {i} " + "x" * (i % 300) + "\n"
    stream = sys.stderr if i % 10 == 0 else sys.stdout
    half = len(text) // 2
    stream.write(text[:half])
    stream.flush()
    stream.write(text[half:])
    if i % 7 == 0:
        stream.flush()
sys.stdout.flush()
sys.stderr.flush()
