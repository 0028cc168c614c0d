"""The tables of docs/bring_your_own_game.md that list which OpenSpiel and TextArena games play here.

Each table is generated from the installed library's own registry (``registry_table()`` of
``lmselfplay.games.openspiel`` / ``lmselfplay.games.textarena``: every game loaded with its default
parameters, TextArena's offline with two players) and written between its markers
``<!-- NAME table -->`` and ``<!-- /NAME table -->``.

    python scripts/games_tables.py [--check] [--only openspiel|textarena]

``--check`` writes nothing: it exits 1 naming each table that differs from the page.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "bring_your_own_game.md"
TABLES = ("openspiel", "textarena")


def generated(name: str) -> str:
    if name == "openspiel":
        from lmselfplay.games.openspiel import registry_table
    else:
        from lmselfplay.games.textarena import registry_table
    return registry_table() + "\n"


def block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- {name} table -->\n)(.*?)(<!-- /{name} table -->)", re.S)


def written(text: str, name: str) -> str:
    m = block(name).search(text)
    if m is None:
        raise SystemExit(f"error: {PAGE.name} has no <!-- {name} table --> ... <!-- /{name} table --> markers")
    return m.group(2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 when a table differs")
    ap.add_argument("--only", choices=TABLES, default=None)
    args = ap.parse_args(argv)
    text = PAGE.read_text()
    stale = []
    for name in [args.only] if args.only else TABLES:
        table = generated(name)
        if written(text, name) != table:
            stale.append(name)
            text = block(name).sub(lambda m, t=table: m.group(1) + t + m.group(3), text)
    if args.check:
        for name in stale:
            print(f"{PAGE.name}: the {name} table differs from the installed library's registry "
                  "(python scripts/games_tables.py rewrites it)")
        print("tables up to date" if not stale else "", end="\n" if not stale else "")
        return 1 if stale else 0
    PAGE.write_text(text)
    print(f"wrote {', '.join(stale) or 'no'} table(s) in {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
