"""The ``eval`` and ``arena`` verbs' arguments: pass@k lists, defaults per benchmark."""

import argparse

import pytest

from lmselfplay.eval.cli import _ks, add_commands


def _parser():
    p = argparse.ArgumentParser()
    add_commands(p.add_subparsers(dest="command"))
    return p


def test_k_lists():
    assert _ks("1,4, 8") == [1, 4, 8]
    for bad, message in (("1,x", "wants integers"), ("0,1", ">= 1"), ("", ">= 1")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            _ks(bad)


def test_each_verb_parses_with_its_defaults():
    p = _parser()
    r = p.parse_args(["eval", "reasoning", "--completions", "c.jsonl", "--k", "1,2"])
    assert (r.suite, r.completions, r.k, r.max_new_tokens) == ("default", "c.jsonl", [1, 2], None)
    h = p.parse_args(["eval", "humaneval", "--limit", "2"])
    assert (h.limit, h.max_new_tokens, h.timeout, h.k) == (2, 256, 3.0, [1, 5])
    a = p.parse_args(["arena", "nim", "--bots", "random,exact"])
    assert (a.game, a.bots, a.games, a.models) == ("nim", "random,exact", 100, [])
    assert r.func.__name__ == "_cmd_reasoning" and a.func.__name__ == "_cmd_arena"
