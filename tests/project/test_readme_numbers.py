"""Every number a table of the README or of ``docs/`` shows cites its results file and key, and the
value there, rounded as the table shows it, is the number shown (the convention:
``tests/provenance.py`` and docs/contributing.md, "Numbers in tables")."""

from __future__ import annotations

import provenance as P

TABLE = """| run | Nim | Kuhn | target |
|---|---|---|---|
| seed 0 | 0.970 (`--beta 0.05`) | 0.110 | ≥ 0.95 |
| mean | 0.955 | 0.13-0.11 | 0.10 |
<!-- results main_job_v7_seed0.json
results.evaluations["100"]["nim/optimal_move_prob"]
results.evaluations["100"]["kuhn_poker/exploitability"]
mean(results.evaluations["100"]["nim/optimal_move_prob"]; main_job_v7_seed1.json: results.evaluations["100"]["nim/optimal_move_prob"])
max(results.evaluations["100"]["kuhn_poker/exploitability"]; main_job_v7_readme.json: results.evaluations["100"]["kuhn_poker/exploitability"])
results.evaluations["100"]["kuhn_poker/exploitability"]
-->
"""


def only_table(markdown: str) -> P.Table:
    (table,) = [t for t in P.tables(markdown, "example.md") if t.numbers]
    return table


def test_a_cited_table_passes():
    table = only_table(TABLE)
    assert [n for _, n in table.numbers] == ["0.970", "0.110", "0.955", "0.13", "0.11"]
    assert P.problems(table) == []


def test_an_edited_number_fails():
    problems = P.problems(only_table(TABLE.replace("| 0.970 (", "| 0.971 (")))
    assert len(problems) == 1 and "shows 0.971" in problems[0] and "0.96953" in problems[0]
    assert P.problems(only_table(TABLE.replace("| 0.955 |", "| 0.950 |"))) != []  # a derived number too


def test_a_missing_key_or_file_fails():
    missing_key = TABLE.replace('["kuhn_poker/exploitability"]\nmean', '["kuhn_poker/exploitabilty"]\nmean')
    assert any("no 'kuhn_poker/exploitabilty'" in p for p in P.problems(only_table(missing_key)))
    missing_file = TABLE.replace("<!-- results main_job_v7_seed0.json", "<!-- results main_job_v9.json")
    assert any("no results file main_job_v9.json" in p for p in P.problems(only_table(missing_file)))
    outside = TABLE.replace("<!-- results main_job_v7_seed0.json", "<!-- results ../../pyproject.toml")
    assert any("no results file" in p for p in P.problems(only_table(outside)))


def test_a_table_without_its_block_or_with_a_key_too_few_fails():
    no_block = TABLE.split("<!--")[0]
    assert P.problems(only_table(no_block)) == ["example.md:1: 5 numbers and no results block"]
    one_short = TABLE.replace('results.evaluations["100"]["kuhn_poker/exploitability"]\n-->', "-->")
    assert P.problems(only_table(one_short)) == ["example.md:1: 5 numbers, 4 keys"]
    added_row = TABLE.replace("| mean |", "| seed 1 | 0.940 | 0.106 | |\n| mean |")
    assert "7 numbers, 5 keys" in P.problems(only_table(added_row))[0]


def test_a_table_in_a_code_block_is_an_example():
    assert [t for t in P.tables("```text\n" + TABLE.split("<!--")[0] + "```\n") if t.numbers] == []


def test_what_is_not_a_measurement_is_named_by_rule():
    assert P.numbers_in_cell("0.89-0.97, -7.63 ± 1.11, 1.13x, 45.2%, 6.6e-06") == [
        "0.89", "0.97", "-7.63", "1.11", "1.13x", "45.2%", "6.6e-06"]
    assert P.numbers_in_cell("`--beta 0.05` ≥ 0.95, < 0.10, target 0.90, v7.1, 2e-3, 3.0.1") == []
    assert P.numbers_in_row("| a | 0.5 | 0.7 |", header=["run", "Nim", "target"]) == ["0.5"]


def test_rounding_and_keys():
    assert P.shows("0.49", 0.485) and P.shows("0.48", 0.485) and not P.shows("0.50", 0.485)
    assert P.shows("0.000", -0.0001) and P.shows("45.2%", 0.452) and P.shows("1.13x", 1.126)
    assert P.shows("6.6e-06", 6.56e-06) and not P.shows("6.5e-06", 6.56e-06)
    assert P.parse_key('results.evaluations["100"]["nim/p"][2].x') == ["results", "evaluations", "100", "nim/p", 2, "x"]
    assert P.parse_key("[-1].heldout") == [-1, "heldout"]


def test_every_table_number_cites_its_results_value():
    problems = [p for page in P.documented_pages() for t in P.tables(page.read_text(), page.name)
                for p in P.problems(t)]
    assert problems == [], "\n".join(problems[:50])


def test_docs_pages_are_checked():
    names = {p.name for p in P.documented_pages()}
    assert {"README.md", "selfplay_games.md", "spin.md", "history.md"} <= names
