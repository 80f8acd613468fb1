"""dtlaunch.doctor.doctor: see docs/architecture.md."""
