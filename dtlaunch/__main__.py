"""dtlaunch's entry point: the command line (dtlaunch.cli)."""

from dtlaunch.cli import main

if __name__ == "__main__":
    main()
