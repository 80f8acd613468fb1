"""Checks: doctor (every host at once), run's pre-flight and its cache, env-check (this machine)."""
