"""``benchmarks/results/`` holds only what is cited: a file a README/docs table cites (its results
block), a figure a page shows, or a file a test or a documented command reads. Everything else is
on the ``results-archive`` branch (docs/benchmarks.md)."""

from __future__ import annotations

import re

import provenance as P

FIGURE = re.compile(r"\]\((?:\.\./|\./)?benchmarks/results/([\w.\-]+)\)")


def figures() -> set[str]:
    return {m.group(1) for page in P.documented_pages() for m in FIGURE.finditer(page.read_text())}


def read_by_tests(names: set[str]) -> set[str]:
    """The files of ``names`` that a test source names (the documented-commands registry included)."""
    sources = "\n".join(p.read_text() for p in (P.ROOT / "tests").rglob("*.py")
                        if p.name not in {"provenance.py", "test_readme_numbers.py", "test_results_cited.py"})
    return {n for n in names if re.search(rf"(?<![\w.\-]){re.escape(n)}(?![\w\-])", sources)}


def uncited(names: set[str]) -> set[str]:
    return names - P.cited_files() - figures() - read_by_tests(names)


def test_the_check_finds_a_file_nobody_cites():
    assert uncited({"main_job_v7_seed0.json", "a_probe_nobody_reads_v9.json"}) == {"a_probe_nobody_reads_v9.json"}
    assert "main_job_v7_readme.png" in figures()


def test_every_results_file_is_cited():
    files = {p.name for p in P.RESULTS.iterdir() if p.is_file()}
    assert uncited(files) == set(), "results files no table, figure or test cites (archive them)"


def test_every_cited_file_exists():
    missing = (P.cited_files() | figures()) - {p.name for p in P.RESULTS.iterdir()}
    assert missing == set()
