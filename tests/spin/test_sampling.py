"""SPIN's generation: chunks of ``generation_batch_size`` seeded ``seed + offset`` (a resumed or
re-sharded run draws the same answers), y' returned exactly as sampled, and a one-process shard
is the whole list."""

from types import SimpleNamespace

from accelerate import PartialState

from lmselfplay.lm.engines.base import Completion, SamplingParams
from lmselfplay.spin.sampling import generate, opponent_answers, sharded


class Recorder:
    def __init__(self):
        self.calls = []

    def generate(self, prompts, sampling):
        self.calls.append((len(prompts), sampling.seed))
        return [Completion(list(p), [len(p), 2], f"{len(p)}@{sampling.seed}", [-0.1, -0.2], "eos")
                for p in prompts]


PROMPTS = [[1] * n for n in (2, 3, 4, 5, 6)]


def test_chunks_are_seeded_by_their_offset():
    engine = Recorder()
    out = generate(engine, PROMPTS, SamplingParams(max_new_tokens=4, seed=7), batch=2, progress=False, desc="x")
    assert engine.calls == [(2, 7), (2, 9), (1, 11)]
    assert [c.text for c in out] == ["2@7", "3@7", "4@9", "5@9", "6@11"]
    engine = Recorder()
    generate(engine, PROMPTS, SamplingParams(max_new_tokens=4), batch=4, progress=False, desc="x")
    assert engine.calls == [(4, None), (1, None)]


def test_opponent_answers_are_the_sampled_ids_text_and_finish():
    cfg = SimpleNamespace(spin=SimpleNamespace(generation_batch_size=3, progress=False))
    got = opponent_answers(Recorder(), PROMPTS[:2], SamplingParams(max_new_tokens=4, seed=0), cfg, "y'")
    assert got == [([2, 2], "2@0", "eos"), ([3, 2], "3@0", "eos")]


def test_one_process_shard_is_everything_in_order():
    assert sharded(PartialState(), [3, 1, 2], lambda mine: [x * 10 for x in mine]) == [30, 10, 20]
    assert sharded(PartialState(), [], lambda mine: [0]) == []
