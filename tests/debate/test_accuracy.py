"""The debate recipe's evaluation step: each protocol's judge accuracy on the eval set, with every
transcript written for the checkpoint (scripted speakers and the rule judge, known answers)."""

import json
import re

from fake_engine import ScriptedEngine
from lm_fixtures import tiny_tokenizer

from lmselfplay.debate.accuracy import judge_accuracy
from lmselfplay.debate.config import DebateConfigs
from lmselfplay.debate.judge import RuleJudge
from lmselfplay.debate.tasks import DebateTask

CONTEXT = "The keeper counted 41 ships in March."


def _speaker(prompt):
    """Quotes the context when defending the true answer, invents a quote otherwise."""
    if re.search(r"You defend: 4", prompt):
        return "It is right: <quote>counted 41 ships</quote>"
    return "Trust me: <quote>counted 90 ships</quote>"


def test_each_protocols_accuracy_and_its_transcripts(tmp_path):
    tok = tiny_tokenizer()
    tasks = [DebateTask(f"t{i}", "test", "How many ships?", CONTEXT, "41", "90") for i in range(4)]
    cfg = DebateConfigs.from_values(output_dir="unused", eval_protocols="debate, none", num_rounds=1, max_prompt_tokens=4000)
    per = judge_accuracy(cfg, tasks, ScriptedEngine(tok, _speaker), tok, RuleJudge(), 5, tmp_path, write=True)
    assert per["debate"]["accuracy"] == 1.0 and per["none"]["accuracy"] == 0.5  # no speeches: a coin
    rows = [json.loads(x) for x in (tmp_path / "eval_transcripts_step5.jsonl").read_text().splitlines()]
    assert [r["protocol"] for r in rows] == ["debate"] * 4 + ["none"] * 4
    assert all(r["correct"] == "41" for r in rows) and all(len(r["speeches"]) == 2 for r in rows[:4])
    judge_accuracy(cfg, tasks, ScriptedEngine(tok, _speaker), tok, RuleJudge(), 6, tmp_path, write=False)
    assert not (tmp_path / "eval_transcripts_step6.jsonl").exists()  # other ranks write nothing
