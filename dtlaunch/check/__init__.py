"""dtlaunch.check: see docs/architecture.md."""
