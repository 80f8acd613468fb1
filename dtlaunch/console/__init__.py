"""dtlaunch.console: see docs/architecture.md."""
