"""The command line's helpers: options, run's flags to a RunRequest, and rendering; with cli.py
the only click and rich users.

See docs/architecture.md."""
