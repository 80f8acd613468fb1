"""dtlaunch.run: see docs/architecture.md."""
