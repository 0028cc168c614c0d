"""A SPIN iteration's data set holds, row for row, the prompt, the data answer (chosen) and the
opponent's answer exactly as sampled (rejected, with its ids and finish reason), tagged with the
iteration and the checkpoint that generated it."""

from lm_fixtures import tiny_tokenizer

from lmselfplay.lm.prompt import format_prompt
from lmselfplay.spin.round import iteration_dataset


def test_iteration_dataset_rows():
    tok = tiny_tokenizer()
    rows = [{"prompt": "2+2?", "answer": "4"}, {"prompt": "3+3?", "answer": "6"}]
    ys = [([9, 2], "five", "eos"), ([8, 8], "si", "length")]
    data = iteration_dataset(tok, rows, [[1, 5], [1, 6]], [[40, 2], [60, 2]], ys, t=3, generator="checkpoint-3")
    assert data.num_rows == 2
    assert data["chosen"] == ["4", "6"] and data["rejected"] == ["five", "si"]
    assert data["prompt_ids"] == [[1, 5], [1, 6]] and data["chosen_ids"] == [[40, 2], [60, 2]]
    assert data["rejected_ids"] == [[9, 2], [8, 8]] and data["finish_reason"] == ["eos", "length"]
    assert data["iteration"] == [3, 3] and data["generator"] == ["checkpoint-3"] * 2
    assert data["formatted_prompt"] == [format_prompt(tok, "2+2?"), format_prompt(tok, "3+3?")]
