"""The answer-extraction rules (lmselfplay.verifiers.answers) on known outputs and junk."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmselfplay.verifiers.answers import (
    MAX_SCAN_CHARS,
    RULES,
    extract_answer,
    extract_boxed,
    extract_code,
    extract_hash,
    extract_tag,
    with_instruction,
)


@pytest.mark.parametrize("text, want", [
    (r"so \boxed{42}", "42"),
    (r"\boxed{1} then \boxed{2}", "2"),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    (r"\boxed{\boxed{1}+2}", r"\boxed{1}+2"),  # the outer box is the answer
    (r"\boxed{3} and an unclosed \boxed{4", "3"),
    (r"\fbox{x^2}", "x^2"),
    (r"}} stray {braces} \boxed { 7 }", "7"),
    ("no box here", None),
    (r"\boxed{", None),
])
def test_boxed(text, want):
    assert extract_boxed(text) == want


@pytest.mark.parametrize("text, want", [
    ("steps\n#### 1,234\n", "1234"),
    ("#### 5.\nmore text", "5"),
    ("#### 3\n#### 4", "4"),
    ("#### 12,34", "12,34"),  # not a thousands separator: kept
    ("####   ", None),
    ("no marker", None),
])
def test_hash(text, want):
    assert extract_hash(text) == want


@pytest.mark.parametrize("text, want", [
    ("<answer> 5 </answer>", "5"),
    ("<answer>1</answer> then <answer>2</answer>", "2"),
    ("<answer>1</answer> and a cut-off <answer>2", "1"),
    ("<answer>never closed", None),
    ("</answer> close before open", None),
    ("<answer>a\nb</answer>", "a\nb"),
])
def test_answer_tag(text, want):
    assert extract_tag(text) == want


def test_code_takes_the_last_fence_and_keeps_indentation():
    text = "first\n```python\nx = 1\n```\nthen\n```\n    return 2\n```\n"
    assert extract_code(text) == "    return 2\n"
    assert extract_code("    return 3\n") == "    return 3\n"


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.binary(), st.none(), st.integers(), st.lists(st.text())),
       st.sampled_from(sorted(RULES)))
def test_never_raises(junk, rule):
    out = extract_answer(junk, rule)
    assert out is None or isinstance(out, str)


def test_huge_inputs_only_scan_the_tail():
    junk = r"\boxed{" * 2_000_000 + "<answer>" * 1_000_000  # 22 MB of unclosed openers
    assert extract_boxed(junk) is None and extract_tag(junk) is None
    # an answer before the scanned tail is out of reach, one inside it is found
    assert extract_boxed(r"\boxed{1}" + "x" * MAX_SCAN_CHARS) is None
    assert extract_boxed("x" * 10_000_000 + r"\boxed{2}") == "2"


def test_unknown_rule_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown answer format"):
        extract_answer("x", "nope")


def test_instruction_matches_rule():
    assert with_instruction("Q?", "answer").endswith(RULES["answer"].instruction)
    assert with_instruction("Q?", "raw") == "Q?"
