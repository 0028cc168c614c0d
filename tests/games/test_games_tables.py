"""docs/bring_your_own_game.md's tables are what the installed OpenSpiel and TextArena registries give
(scripts/games_tables.py), and the check fails on a table that differs."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("games_tables", ROOT / "scripts" / "games_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_changed_row_fails_the_check(tmp_path, monkeypatch, capsys):
    pytest.importorskip("pyspiel")
    tables = _script()
    page = tmp_path / "page.md"
    page.write_text((ROOT / "docs" / "bring_your_own_game.md").read_text())
    monkeypatch.setattr(tables, "PAGE", page)
    assert tables.main(["--check", "--only", "openspiel"]) == 0
    page.write_text(page.read_text().replace("| `leduc_poker` | loads |", "| `leduc_poker` | refused: no |"))
    assert tables.main(["--check", "--only", "openspiel"]) == 1
    assert "openspiel table differs" in capsys.readouterr().out
    assert tables.main(["--only", "openspiel"]) == 0  # rewrites it
    assert "| `leduc_poker` | loads |" in page.read_text()


@pytest.mark.slow
def test_the_textarena_table_is_up_to_date():
    pytest.importorskip("textarena")
    assert _script().main(["--check", "--only", "textarena"]) == 0
