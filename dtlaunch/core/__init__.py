"""dtlaunch.core: see docs/architecture.md."""
