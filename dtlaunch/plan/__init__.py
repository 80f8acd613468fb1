"""From the user's request to the exact launch plan, pure: hosts, environment, command forms,
binding.

See docs/architecture.md."""
