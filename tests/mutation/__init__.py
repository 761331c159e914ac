"""Mutation testing of the pure core with mutmut (``tox -e mutation``; docs/testing.md)."""
