"""``python -m dtlaunch.examples.ptb_lm``: train the PTB language model."""

import os
import sys

from .train import LEAVE_AT_ONCE, main

if __name__ == "__main__":
    code = main()
    if LEAVE_AT_ONCE[0]:  # a finished torch.distributed run: see train.main
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
