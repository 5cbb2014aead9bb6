"""Pure functions from sample rows to advantages."""
