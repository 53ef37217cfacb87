"""Generators of the docs and the dashboard's contracts from their one definition (`make docs`); a test fails while one is stale."""
