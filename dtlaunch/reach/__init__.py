"""How hosts are reached over ssh: options, OpenSSH's config, failures with fixes, proxies, keys,
known_hosts.

See docs/architecture.md."""
