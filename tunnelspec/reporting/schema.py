"""The JSON-lines output format as data: one JSON Schema (draft 2020-12) per line of
`--format json`. docs/output.md documents the same thing in prose; tests validate real runs
against EVENT_SCHEMA. Bump reporting.SCHEMA_VERSION when a field is removed or changes meaning;
adding an optional field or a new event kind does not (consumers must ignore unknown keys)."""

from __future__ import annotations

from tunnelspec.reporting import SCHEMA_VERSION
from tunnelspec.reporting.summary import STATUSES

_STR = {"type": "string"}
_HOST = {"type": "string", "minLength": 1}


def _event(kind: str, required: dict, optional: dict | None = None, extra: bool = False) -> dict:
    props = {"schema": {"const": SCHEMA_VERSION}, "event": {"const": kind}, **required, **(optional or {})}
    return {
        "type": "object",
        "required": ["schema", "event", *required],
        "properties": props,
        # progress events carry task-specific numbers (percent, draft_n, …); others are closed so a
        # renamed field is caught by the tests.
        "additionalProperties": extra,
    }


COUNTERS = {
    "type": "object",
    "required": list(STATUSES),
    "properties": {s: {"type": "integer", "minimum": 0} for s in STATUSES},
    "additionalProperties": False,
}

EVENTS = {
    "run_start": _event("run_start", {"playbook": _STR, "check": {"type": "boolean"}}),
    "play_start": _event("play_start", {"play": _STR, "hosts": {"type": "array", "items": _HOST}}),
    "task_result": _event(
        "task_result",
        {"host": _HOST, "task": _STR, "play": _STR, "status": {"enum": list(STATUSES)}, "msg": _STR},
        {
            "module": _STR,
            "duration": {"type": "number", "minimum": 0},
            "would_change": {"const": True},
            "after": {"type": "array", "items": _STR},
            "no_log": {"const": True},
            "diff": {
                "type": "object",
                "required": ["before", "after"],
                "additionalProperties": False,
                "properties": {"path": _STR, "before": _STR, "after": _STR},
            },
        },
    ),
    "unreachable": _event("unreachable", {"host": _HOST, "play": _STR, "msg": _STR}, {"task": _STR}),
    # A long wait (the /health wait, a git fetch, apt-get) says where it stands: elapsed_s (and budget_s,
    # what it waits for, llama-server's newest journal line when there is one).
    "progress": _event(
        "progress",
        {"host": _HOST, "task": _STR, "msg": _STR},
        {
            "percent": {"type": "number", "minimum": 0, "maximum": 100},
            "elapsed_s": {"type": "number", "minimum": 0},
            "budget_s": {"type": "number", "minimum": 0},
            "waiting_for": _STR,
            "journal": _STR,
        },
        extra=True,
    ),
    "gate": _event("gate", {"play": _STR, "status": {"enum": ["ok", "failed", "planned"]}, "msg": _STR}),
    "host_key_pinned": _event("host_key_pinned", {"host": _HOST, "msg": _STR}),
    "message": _event("message", {"msg": _STR}),
    # An error that stopped the command before or outside a run (exit 2: bad options, inventory or
    # playbook); the same text is on stderr as `ERROR: …`.
    # exit 5: another run holds the cluster's run lock (--no-wait, or --lock-timeout passed).
    # 70: an internal error (its traceback in a file the msg names); 130: interrupted (Ctrl-C).
    "error": _event("error", {"msg": _STR, "exit_code": {"enum": [1, 2, 3, 4, 5, 70, 130]}}),
    # A mutating run waiting for another run's lock on a host (engine/runlock.py); holder: who.
    "run_lock": _event(
        "run_lock",
        {"host": _HOST, "status": {"enum": ["waiting"]}, "msg": _STR},
        {
            "holder": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"command": _STR, "pid": {"type": "integer"}, "controller": _STR, "since": _STR},
            }
        },
    ),
    "recap": _event(
        "recap", {"hosts": {"type": "object", "additionalProperties": COUNTERS}, "exit_code": {"enum": [0, 1, 2, 3, 4]}}
    ),
    # `tunnelspec hostkeys scan --format json`: one per host.
    "host_keys": _event(
        "host_keys",
        {
            "host": _HOST,
            "address": _STR,
            "port": {"type": "integer"},
            "error": {"type": ["string", "null"]},
            "skipped": {"type": ["string", "null"]},
            "keys": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["algorithm", "fingerprint", "status", "known_hosts_line"],
                    "properties": {
                        "algorithm": _STR,
                        "fingerprint": {"type": "string", "pattern": "^SHA256:"},
                        "status": {"enum": ["pinned", "not pinned", "CHANGED"]},
                        "known_hosts_line": _STR,
                    },
                },
            },
        },
    ),
}

EVENT_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": f"https://tunnelspec.invalid/schema/events-v{SCHEMA_VERSION}.json",
    "title": f"tunnelspec --format json event (schema {SCHEMA_VERSION})",
    "type": "object",
    "required": ["schema", "event"],
    "oneOf": list(EVENTS.values()),
}
