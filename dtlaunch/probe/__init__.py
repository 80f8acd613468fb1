"""dtlaunch.probe.command: see docs/architecture.md."""
