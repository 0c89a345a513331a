"""The compiled-template cache on the controller's disk (core/codecache.py): a run that finds a source's
code there renders exactly what compiling it gives, without compiling; a cache file it cannot trust
(a link, writable by others, someone else's, corrupt) is ignored, not followed; no cache root, no
files."""

from __future__ import annotations

import atexit
import marshal
import os
import stat
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
from jinja2 import meta

from tunnelspec.core import codecache, templating
from tunnelspec.core.templating import TemplateError, evaluate, render_file, render_value

ROOT = Path(__file__).resolve().parents[2]
VARS = {"port": 15052, "host": "10.77.0.11", "items": ["a", "b c"], "flag": "yes", "off": "no", "n": None}
GOOD = [  # (function, source): every one renders
    (render_value, "{{ port }}"),  # a whole expression keeps its native type
    (render_value, "{{ items }}"),
    (render_value, "{{ n }}"),
    (render_value, "{{ flag | bool }}"),
    (render_value, "{{ off | bool }}"),
    (render_value, "{{ items | shlex_join }}"),
    (render_value, "--host {{ host }}:{{ port }} {{ items | shlex_join }}"),
    (render_value, "{{ range(2) | list | length }}"),
    (render_value, "{% set x = port %}{{ x + 1 }}"),
    (render_value, "{% for i in items %}[{{ i }}]{% endfor %}"),
    (evaluate, "flag | bool and port > 1"),
    (evaluate, "off | bool"),
    (evaluate, "n is none"),
    (render_file, "listen {{ host }}\n"),  # the trailing newline is kept
    (render_file, "a\n{% if flag | bool %}\nb {{ port }}\n{% endif %}\n\n"),
]
BAD = [  # (function, source): every one raises TemplateError
    (render_value, "{{ nope }}"),
    (render_value, "a {{ host }} {{ nope }}"),
    (render_value, "{{ port + }}"),
    (render_value, "{{ port | nofilter }}"),  # an error of the code generation, not of the parse
    (evaluate, "nope == 1"),
    (evaluate, "port >"),
    (evaluate, "a b"),
    (evaluate, "port | nofilter"),
    (render_file, "{{ nope.x }}"),
    (render_file, "x\n{% if %}"),
]


def outcome(fn, source):
    try:
        out = fn(source, dict(VARS))
        return "ok", type(out), out
    except TemplateError as e:
        return "error", str(e)


def outcomes():
    return [outcome(fn, s) for fn, s in GOOD + BAD]


@pytest.fixture
def restart(tmp_path, monkeypatch):
    """Each call: the state of a new process (no template in memory, the disk cache not read yet)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    made = []

    def fresh():
        templating._template.cache_clear()
        templating._expression.cache_clear()
        disk = codecache.CodeCache("templates", templating._context(templating._ENV))
        monkeypatch.setattr(templating, "_DISK", disk)
        made.append(disk)
        return disk

    fresh()
    yield fresh
    templating._template.cache_clear()
    templating._expression.cache_clear()
    for disk in made:  # no writes into tmp_path at the exit of pytest
        atexit.unregister(disk.flush)


def cache_dir(tmp_path) -> Path:
    return tmp_path / "xdg" / "tunnelspec" / "templates"


def no_compiling(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("compiled a template the disk cache holds")

    monkeypatch.setattr(templating, "_Codegen", boom)
    monkeypatch.setattr(templating, "Parser", boom)
    monkeypatch.setattr(templating._ENV, "parse", boom)
    monkeypatch.setattr(templating._ENV, "compile", boom)


def test_the_results_are_the_same_without_the_cache_cold_and_from_disk(restart, tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_CACHE_HOME")  # and HOME has no .cache: no disk cache at all
    without = outcomes()
    assert without[:3] == [("ok", int, 15052), ("ok", list, ["a", "b c"]), ("ok", type(None), None)]
    assert without[5] == ("ok", str, "a 'b c'") and without[3][2] is True and without[4][2] is False
    assert without[13] == ("ok", str, "listen 10.77.0.11\n")
    errors = [o[1] for o in without[len(GOOD) :]]
    assert errors == [
        "'nope' is undefined",
        "'nope' is undefined",
        "template error: unexpected 'end of template'",
        "template error: No filter named 'nofilter'.",
        "'nope' is undefined",
        "in 'when: port >': unexpected 'end of template'",
        "in 'when: a b': chunk after expression",
        "in 'when: port | nofilter': No filter named 'nofilter'.",
        "template: 'nope' is undefined",
        "template:2: Expected an expression, got 'end of statement block'",
    ]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    disk = restart()
    assert outcomes() == without  # cold: compiled, kept for the exit
    disk.flush()
    assert (cache_dir(tmp_path) / codecache.FILE).is_file()
    restart()
    no_compiling(monkeypatch)
    assert [outcome(fn, s) for fn, s in GOOD] == without[: len(GOOD)]  # from disk, nothing compiled


def test_the_code_and_names_are_jinja2s_own(restart):
    """One parse and one pass of jinja2's code generator give the code `Environment.compile` gives and
    the names `meta.find_undeclared_variables` finds, for the shipped templates and the cases above."""
    env = templating._ENV
    sources = [p.read_text() for p in sorted((ROOT / "templates").glob("*.j2"))]
    sources += [s for fn, s in GOOD if fn is not evaluate]
    for s in sources:
        code, names = templating._compile("template", s)
        assert code == env.compile(s)
        assert names == meta.find_undeclared_variables(env.parse(s))
    for s in [s for fn, s in GOOD if fn is evaluate] + ["port", "items | shlex_join", "x.y[z] ~ w"]:
        code, names = templating._compile("expression", s)
        assert templating._from_code(code).root_render_func.__code__ == (
            env.compile_expression(s)._template.root_render_func.__code__
        )
        assert names == meta.find_undeclared_variables(env.parse("{{ " + s + " }}"))


def test_a_second_process_renders_from_disk_without_compiling(tmp_path):
    """Two real processes: the first compiles and writes the cache at its exit; the second finds all
    there, compiles nothing and writes nothing."""
    script = (
        "import sys\n"
        "from tunnelspec.core import templating as t\n"
        "if sys.argv[1] == 'forbid':\n"
        "    t._Codegen = t.Parser = None\n"
        "print(t.render_value('{{ port + 1 }}', {'port': 1}), t.evaluate('a | bool', {'a': 'yes'}),\n"
        "      repr(t.render_file('x {{ a }}\\n', {'a': 2})))\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "PYTHONPATH": str(ROOT)}

    def run(arg):
        r = subprocess.run([sys.executable, "-c", script, arg], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert run("compile") == "2 True 'x 2\\n'\n"
    path = cache_dir(tmp_path) / codecache.FILE
    before = path.stat()
    assert stat.S_IMODE(before.st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert run("forbid") == "2 True 'x 2\\n'\n"
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_run_that_finds_everything_writes_nothing(restart, tmp_path, monkeypatch):
    render_value("{{ port }}", VARS)
    templating._DISK.flush()
    assert (cache_dir(tmp_path) / codecache.FILE).is_file()
    disk = restart()
    monkeypatch.setattr(codecache, "_write", lambda *a: pytest.fail("wrote the cache"))
    assert render_value("{{ port }}", VARS) == 15052
    disk.flush()


def poisoned(tmp_path, restart) -> Path:
    """A cache file whose entry for "{{ port }}" is the code of "{{ 'evil' }}": trusted, it is run."""
    disk = restart()
    code, names = templating._compile("expression", "'evil'")
    key = disk.key("expression", "port")
    d = cache_dir(tmp_path)
    d.mkdir(parents=True, mode=0o700)
    blob = marshal.dumps((key, code, names))
    (d / codecache.FILE).write_bytes(marshal.dumps((codecache.FORMAT, {key: blob})))
    os.chmod(d / codecache.FILE, 0o600)
    restart()
    return d / codecache.FILE


def test_a_trusted_cache_file_is_run(restart, tmp_path):
    """The cases below are not vacuous: the same file, trusted, gives its code's result."""
    poisoned(tmp_path, restart)
    assert render_value("{{ port }}", VARS) == "evil"


def _symlink(path: Path):
    real = path.with_name("elsewhere")
    path.rename(real)
    path.symlink_to(real)


def _other_owner(path: Path):
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")
    os.chown(path, 12345, -1)


def _swapped_key(path: Path):
    tag, entries = marshal.loads(path.read_bytes())
    (key, blob), = entries.items()
    path.write_bytes(marshal.dumps((tag, {key[::-1]: blob, key: marshal.dumps((key[::-1], *marshal.loads(blob)[1:]))})))


UNTRUSTED = {
    "a symbolic link": _symlink,
    "a group-writable file": lambda p: os.chmod(p, 0o620),
    "a world-writable file": lambda p: os.chmod(p, 0o602),
    "a group-writable directory": lambda p: os.chmod(p.parent, 0o770),
    "a directory that is a link": lambda p: (p.parent.rename(p.parent.with_name("real")),
                                             p.parent.symlink_to(p.parent.with_name("real"))),
    "another user's file": _other_owner,
    "another user's directory": lambda p: _other_owner(p.parent),
    "corrupt bytes": lambda p: p.write_bytes(b"\x00garbage" * 10),
    "a truncated file": lambda p: p.write_bytes(p.read_bytes()[:-7]),
    "another format": lambda p: p.write_bytes(marshal.dumps(("other", marshal.loads(p.read_bytes())[1]))),
    "an entry under another key": _swapped_key,
    "a wrong entry type": lambda p: p.write_bytes(marshal.dumps((codecache.FORMAT, {b"k": 1, 2: b"v"}))),
}


@pytest.mark.parametrize("spoil", UNTRUSTED.values(), ids=UNTRUSTED.keys())
def test_an_untrusted_cache_file_is_ignored(restart, tmp_path, spoil):
    spoil(poisoned(tmp_path, restart))
    assert render_value("{{ port }}", VARS) == 15052


def test_without_a_cache_root_nothing_is_written(restart, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.delenv("XDG_CACHE_HOME")
    disk = restart()
    assert outcomes()[0] == ("ok", int, 15052)
    disk.flush()
    assert list(home.iterdir()) == []
    (home / ".cache").mkdir()  # the same run with a ~/.cache: it is used
    disk = restart()
    render_value("{{ port }}", VARS)
    disk.flush()
    assert (home / ".cache" / "tunnelspec" / "templates" / codecache.FILE).is_file()


def test_another_version_misses(restart, tmp_path, monkeypatch):
    render_value("{{ port }}", VARS)
    templating._DISK.flush()
    assert (cache_dir(tmp_path) / codecache.FILE).is_file()
    monkeypatch.setattr(codecache, "VERSION", codecache.VERSION + 1)
    restart()
    calls = []
    real = templating._Codegen
    monkeypatch.setattr(templating, "_Codegen", lambda e: calls.append(1) or real(e))
    assert render_value("{{ port }}", VARS) == 15052 and calls == [1]


def test_the_file_keeps_the_entries_used_last_up_to_its_cap(restart, tmp_path, monkeypatch):
    monkeypatch.setattr(codecache, "CAP", 3)
    for run in (["a", "b"], ["c", "d"], ["a", "e"]):
        disk = restart()
        for name in run:
            render_value("{{ " + name + " }}", {name: 1})
        disk.flush()
    _, entries = marshal.loads((cache_dir(tmp_path) / codecache.FILE).read_bytes())
    disk = restart()
    assert list(entries) == [disk.key("expression", n) for n in ("a", "e", "c")]


def test_jinja2_errors_are_not_cached(restart):
    disk = restart()
    with pytest.raises(TemplateError):
        render_value("{{ port + }}", VARS)
    with pytest.raises(TemplateError):
        render_file("{{ port | nofilter }}", VARS)
    assert disk._used == {} and not disk._new
    with pytest.raises(jinja2.TemplateSyntaxError):
        templating._compile("template", "{{ port + }}")
