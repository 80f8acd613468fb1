"""Facts judged, pure: what hosts reported, the checks with their fixes, the one report model."""
