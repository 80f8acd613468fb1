"""Facts judged, pure: what the hosts reported, the checks with their fixes, the one report
model.

See docs/architecture.md."""
