"""observability room (see docs/architecture.md)."""
