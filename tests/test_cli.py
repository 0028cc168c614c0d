"""The `lmselfplay` command: subcommands and the options passed through to them."""

import pytest

from lmselfplay import cli


def test_show_prints_a_game(capsys):
    assert cli.main(["show", "kuhn_poker", "--prompt"]) == 0
    assert "Your card:" in capsys.readouterr().out


def test_show_prints_the_prompt_in_the_text_the_model_reads(tmp_path, capsys):
    from lm_fixtures import save_tiny

    assert cli.main(["show", "tictactoe", "--prompt"]) == 0  # the embedded model (v7): the cells text
    prompt = capsys.readouterr().out.split("what the model reads")[1]
    assert "1_2_3_" in prompt and "Legal moves" not in prompt
    assert cli.main(["show", "tictactoe", "--prompt", "--model", str(save_tiny(tmp_path))]) == 0
    prompt = capsys.readouterr().out.split("what the model reads")[1]  # a model with no recorded text
    assert "1 2 3" in prompt and "Legal moves" in prompt


def test_passthrough_keeps_leading_options(tmp_path):
    """`lmselfplay bootstrap --force` / `gametheory-plots --out D` once failed with
    "unrecognized arguments": argparse's REMAINDER drops a remainder that starts with an option."""
    assert cli.main(["gametheory-plots", "--out", str(tmp_path / "plots"), "--T", "50"]) == 0
    assert list((tmp_path / "plots").glob("*.png"))


def test_a_user_error_in_a_verb_is_one_line_and_status_2(tmp_path, capsys):
    assert cli.main(["arena", "nim", "--bots", "random,exact", "--max-new-tokens", "0", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "lmselfplay arena: error: --max-new-tokens must be >= 1, got 0"


def test_unknown_subcommand_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["train-everything"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err
