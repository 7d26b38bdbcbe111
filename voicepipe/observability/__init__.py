"""observability room (see DESIGN.md)."""
