"""Locust load tests of a running Minions server: `python -m loadtest.run` (what `make loadtest` runs)."""
