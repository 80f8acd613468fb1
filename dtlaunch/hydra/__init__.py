"""dtlaunch.hydra.family: see docs/architecture.md."""
