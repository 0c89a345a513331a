"""docs/modules.md is generated from the task registry and must match it: a new module, a new
argument, a changed default or help text without regenerating fails here."""

from __future__ import annotations

import subprocess
import sys

from tunnelspec.engine.registry import load_all
from tunnelspec.commands.modules_doc import DOC, render


def test_modules_md_is_current():
    assert DOC.read_text() == render(), "docs/modules.md is stale: run `python -m tunnelspec.commands.modules_doc`"


def test_every_module_and_argument_describes_itself():
    tasks = load_all()
    assert [m for m, cls in tasks.items() if not (cls.__doc__ or "").strip()] == []
    assert [(m, n) for m, cls in tasks.items() for n, a in cls.args.items() if not a.help.strip()] == []
    text = render()
    for module, cls in tasks.items():
        assert f"## `{module}`" in text
        for name in cls.args:
            assert f"| `{name}` |" in text


def test_check_mode_of_the_generator_reports_staleness(tmp_path, monkeypatch):
    import tunnelspec.commands.modules_doc as docs

    stale = tmp_path / "modules.md"
    stale.write_text(render().replace("## `copy`", "## `copy-renamed`"))
    monkeypatch.setattr(docs, "DOC", stale)
    assert docs.main(["--check"]) == 1
    assert docs.main([]) == 0 and docs.main(["--check"]) == 0
    # and the real entry point agrees on the real file
    res = subprocess.run([sys.executable, "-m", "tunnelspec.commands.modules_doc", "--check"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
