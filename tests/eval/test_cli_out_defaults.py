"""``lmselfplay eval`` and ``arena`` write under ``runs/`` by default, never into the repository."""

import argparse

from lmselfplay.eval.cli import add_commands


def test_eval_and_arena_outputs_go_under_runs_by_default():
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="verb"))
    for argv in (["eval", "reasoning"], ["eval", "humaneval"], ["arena", "nim"]):
        out = parser.parse_args(argv).out
        assert out.startswith("runs/"), (argv, out)
