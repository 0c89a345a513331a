"""The speculative type llama-server is actually running, from its own HTTP answers.

`/props` carries `default_generation_settings.params["speculative.types"]`; in the trees seen here
that object is built from the sampling defaults only, so it can say "none" while the server
speculates. Each slot in `/slots` shows the params of its last task, copied from the server's
real settings: after one completion that is the type in use. Both are read; a slot's value wins.
"""

from __future__ import annotations

from tunnelspec.core import http

KEY = "speculative.types"


def _types(params) -> str | None:
    """The comma list without "none": a server given `--spec-type draft-eagle3` reports
    "none,draft-eagle3" (the default entry stays in the list)."""
    value = params.get(KEY) if isinstance(params, dict) else None
    if not isinstance(value, str) or not value:
        return None
    kinds = [t for t in value.split(",") if t and t != "none"]
    return ",".join(kinds) if kinds else "none"


def spec_types(props: dict | None, slots: list | None) -> dict:
    """{"props": …, "slots": …, "active": …}: `active` is a slot's non-"none" value, else /props'."""
    from_props = _types(((props or {}).get("default_generation_settings") or {}).get("params"))
    from_slots = None
    for slot in slots or []:
        t = _types(slot.get("params")) if isinstance(slot, dict) else None
        if t and t != "none":
            from_slots = t
            break
        from_slots = from_slots or t
    active = from_slots if from_slots and from_slots != "none" else (from_props or from_slots)
    return {"props": from_props, "slots": from_slots, "active": active}


async def read_spec_types(opener, api_key: str | None = None, timeout: float = 10.0) -> dict:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    docs = {}
    for path in ("/props", "/slots"):
        try:
            r = await http.request(opener, "GET", path, timeout=timeout, headers=headers)
            docs[path] = r.json() if r.status == 200 else None
        except (http.HttpError, ValueError):
            docs[path] = None
    out = spec_types(docs["/props"], docs["/slots"] if isinstance(docs["/slots"], list) else None)
    out["raw_props"] = docs["/props"]
    return out
