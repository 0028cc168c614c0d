"""The `lmselfplay` command: subcommands and the options passed through to them."""

import pytest

from lmselfplay import cli


def test_show_prints_a_game(capsys):
    assert cli.main(["show", "kuhn_poker", "--prompt"]) == 0
    assert "Your card:" in capsys.readouterr().out


def test_passthrough_keeps_leading_options(tmp_path):
    """`lmselfplay bootstrap --force` / `gametheory-plots --out D` once failed with
    "unrecognized arguments": argparse's REMAINDER drops a remainder that starts with an option."""
    assert cli.main(["gametheory-plots", "--out", str(tmp_path / "plots"), "--T", "50"]) == 0
    assert list((tmp_path / "plots").glob("*.png"))


def test_unknown_subcommand_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["train-everything"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err
