"""Code, configs and pyproject say what is, not how it came to be: no issue numbers or commit hashes.

History lives in commit messages and docs/history.md. An upstream project's issue or pull request
is a reference, written ``owner/repo#N`` (``huggingface/trl#6798``), and allowed.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ["lmselfplay", "games", "verifiers", "eval", "recipes", "tests", "benchmarks", "pyproject.toml"]
SKIPPED = {Path(__file__).resolve(), ROOT / "benchmarks" / "results"}  # the check's own examples; recorded runs
SUFFIXES = {".py", ".yaml", ".yml", ".toml", ".sh", ".cfg", ".md", ".txt"}
UPSTREAM = r"[\w.-]+/[\w.-]+"
HISTORY = [
    ("issue number", re.compile(r"\b(?:issue|pr|pull request)s?\s+#?\d+", re.I)),
    ("issue number", re.compile(r"(?<![\w.-])#\d{2,}\b")),
    # a quoted hex string is data (a build's key, a digest), not a reference to a commit
    ("commit hash", re.compile(r"(?<![\w\"'-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w-])")),
]


def history_in(text: str) -> list[str]:
    """The issue numbers and commit hashes in ``text`` (upstream ``owner/repo#N`` references allowed)."""
    text = re.sub(rf"{UPSTREAM}#\d+", "", text)
    return [f"{what}: {m.group(0)}" for what, pattern in HISTORY for m in pattern.finditer(text)]


def scanned_files() -> list[Path]:
    out = []
    for name in SCANNED:
        path = ROOT / name
        out += [path] if path.is_file() else [p for p in sorted(path.rglob("*"))
                                               if p.suffix in SUFFIXES and "__pycache__" not in p.parts
                                               and not SKIPPED & {p.resolve(), *p.parents}]
    return out


def test_the_check_finds_history_and_allows_upstream_references():
    assert history_in("# v4 (issue 30): the cells tokenizer") == ["issue number: issue 30"]
    assert history_in("fixed in #42 last week") == ["issue number: #42"]
    assert history_in("fresh clones: b798fce 411-419 s") == ["commit hash: b798fce"]
    assert history_in("see commit 94193af2c1d0e8f7a6b5c4d3e2f1a0b9c8d7e6f5") != []
    assert history_in("huggingface/trl#6798 fixed the same ordering; vllm-project/vllm#50902") == []
    assert history_in("color '#1f77b4', 1849928 tokens, seed 12345678, digest deadbeef") == []
    assert history_in('assert build.key() == "92ae7ac73836"') == []


def test_code_and_configs_carry_no_history():
    found = {str(p.relative_to(ROOT)): hits for p in scanned_files()
             if (hits := history_in(p.read_text(errors="replace")))}
    assert found == {}, f"history in code or configs (say what is; history goes in commits): {found}"
