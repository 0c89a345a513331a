"""facts/units.parse_stale: which units run from an older file than the one installed (what
_STALE_SCRIPT prints: systemd's block per unit, NeedDaemonReload and ActiveEnterTimestamp in unix
seconds, then the unit files' mtimes)."""

from tunnelspec.facts.units import parse_stale


def test_reload_pending_and_file_newer_than_start_are_stale():
    names = ["a.service", "b.service", "c.service", "d.service", "e.service", "f.service"]
    blocks = [
        ("@1700000100", "no"),   # started after its file was written: current
        ("@1700000000", "no"),   # file written after the start: a restart is owed
        ("@1700000100", "yes"),  # systemd itself says the file changed
        ("@1700000000", "no"),   # same second: taken as current
        ("", "no"),              # inactive (no start time): the service check's job
        ("", "yes"),             # inactive, but the file changed
    ]
    text = "\n\n".join(f"ActiveEnterTimestamp={t}\nNeedDaemonReload={r}" for t, r in blocks)
    mtimes = [1700000000, 1700000100, 1700000000, 1700000000, 1700000000, 1700000000]
    text += "\n== mtimes\n" + "".join(f"{m} {n}\n" for m, n in zip(mtimes, names))
    assert parse_stale(text, names) == {"b.service": "unit file newer than the running service",
                                        "c.service": "unit file changed, not reloaded",
                                        "f.service": "unit file changed, not reloaded"}
    # Blocks that cannot be lined up with the units (one missing) tell nothing.
    assert parse_stale(text.replace("ActiveEnterTimestamp=@1700000100\nNeedDaemonReload=no\n\n", "", 1), names) == {}
    # systemd before 248 (no --timestamp=unix): NeedDaemonReload alone.
    assert parse_stale("NeedDaemonReload=yes\n\nNeedDaemonReload=no\n== mtimes\n", names[:2]) == {
        "a.service": "unit file changed, not reloaded"}


def test_systemctl_show_and_service_state_parsers():
    from tunnelspec.facts.units import parse_service_state, parse_show

    text = "LoadState=loaded\nUnitFileState=enabled\nActiveState=inactive\nWants=a.service b.service\n"
    assert parse_show(text) == {"LoadState": "loaded", "UnitFileState": "enabled", "ActiveState": "inactive",
                                "Wants": "a.service b.service"}
    assert parse_show("ExecStart={ path=/x ; argv[]=/x -a=1 }\n") == {"ExecStart": "{ path=/x ; argv[]=/x -a=1 }"}
    assert parse_service_state("active\nenabled\n") == ("active", "enabled")
    assert parse_service_state("inactive\n") == ("inactive", "")
