"""facts/units.parse_stale: which units run from an older file than the one installed (what
_STALE_SCRIPT prints: unit, NeedDaemonReload, ActiveEnterTimestamp in unix seconds, file mtime)."""

from tunnelspec.facts.units import parse_stale


def test_reload_pending_and_file_newer_than_start_are_stale():
    text = "\n".join([
        "a.service no 1700000100 1700000000",    # started after its file was written: current
        "b.service no 1700000000 1700000100",    # file written after the start: a restart is owed
        "c.service yes 1700000100 1700000000",   # systemd itself says the file changed
        "d.service no 1700000000 1700000000",    # same second: taken as current
        "e.service no 1700000000",               # inactive (no start time): the service check's job
        "f.service yes 1700000000",              # inactive, but the file changed
    ])
    assert parse_stale(text) == {"b.service": "unit file newer than the running service",
                                 "c.service": "unit file changed, not reloaded",
                                 "f.service": "unit file changed, not reloaded"}


def test_systemctl_show_and_service_state_parsers():
    from tunnelspec.facts.units import parse_service_state, parse_show

    text = "LoadState=loaded\nUnitFileState=enabled\nActiveState=inactive\nWants=a.service b.service\n"
    assert parse_show(text) == {"LoadState": "loaded", "UnitFileState": "enabled", "ActiveState": "inactive",
                                "Wants": "a.service b.service"}
    assert parse_show("ExecStart={ path=/x ; argv[]=/x -a=1 }\n") == {"ExecStart": "{ path=/x ; argv[]=/x -a=1 }"}
    assert parse_service_state("active\nenabled\n") == ("active", "enabled")
    assert parse_service_state("inactive\n") == ("inactive", "")
