"""dtlaunch.plan.plan: see docs/architecture.md."""
