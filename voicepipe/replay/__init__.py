"""replay room (see DESIGN.md)."""
