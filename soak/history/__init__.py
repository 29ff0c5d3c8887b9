"""``soak history``: many nights read together (docs/nightly.md)."""
