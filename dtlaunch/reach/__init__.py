"""dtlaunch.reach: see docs/architecture.md."""
