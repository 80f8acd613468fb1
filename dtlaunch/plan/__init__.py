"""From the user's request to the exact launch plan, pure: RunRequest -> RunPlan, with the
MPI family that starts the job.

See docs/architecture.md."""
