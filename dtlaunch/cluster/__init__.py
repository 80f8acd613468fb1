"""dtlaunch.cluster.placement: see docs/architecture.md."""
