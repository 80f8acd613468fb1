"""dtlaunch.openmpi.family: see docs/architecture.md."""
