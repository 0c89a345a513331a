"""Read-only observations: a command plus a pure parser of its output."""
