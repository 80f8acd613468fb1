"""How hosts are reached over ssh: options, config, failures and fixes, proxies, keys."""
