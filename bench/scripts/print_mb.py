"""A rank that prints MB megabytes of 'x': in lines of 100 bytes, or in one line without a newline.

    print_mb.py lines|line MB
"""

import sys

mode, total = sys.argv[1], int(float(sys.argv[2]) * 1000 * 1000)
piece = b"x" * 99 + b"\n" if mode == "lines" else b"x" * 65536
out = sys.stdout.buffer
written = 0
while written < total:
    chunk = piece if total - written >= len(piece) else piece[:total - written]
    out.write(chunk)
    written += len(chunk)
out.flush()
