"""Events → human recap or JSON lines; one Summary owns the counters and the exit code."""

SCHEMA_VERSION = 1
