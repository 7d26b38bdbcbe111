"""pipeline room (see DESIGN.md)."""
