"""dtlaunch's entry point: a `run` typed again starts its launcher first (dtlaunch.run.early_start),
then the command line is read (dtlaunch.cli)."""

import sys


def main() -> None:
    if sys.argv[1:2] == ["run"]:
        from dtlaunch.run.early_start import try_start

        try_start(sys.argv[1:])
    from dtlaunch.cli import main as read_command_line

    read_command_line()


if __name__ == "__main__":
    main()
