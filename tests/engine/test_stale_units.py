"""tasks/systemd.parse_stale: which units run from an older file than the one installed (what
_STALE_SCRIPT prints: unit, NeedDaemonReload, ActiveEnterTimestamp in unix seconds, file mtime)."""

from tunnelspec.tasks.systemd import parse_stale


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
