"""Watched config sources besides SIGHUP: the config file itself, and an etcd key prefix."""
