"""dtlaunch.horovod: see docs/architecture.md."""
