"""replay room (see docs/architecture.md)."""
