"""``python -m dtlaunch.examples.ptb_lm``: train the PTB language model."""

import sys

from .train import main

if __name__ == "__main__":
    sys.exit(main())
