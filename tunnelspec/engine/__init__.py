"""The engine: playbooks in, per-host results out."""
