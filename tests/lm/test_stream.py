"""Many completions as one stream of engine calls: every (prompt, sample) answered in place,
chunks of the engine's batch size, longest prompts first, chunk c seeded seed + c."""

from lmselfplay.lm.engines.base import Completion, SamplingParams
from lmselfplay.lm.stream import generate_stream


class Recorder:
    """Answers each prompt with its length and the call's seed; records every call."""

    max_batch_size = 3

    def __init__(self):
        self.calls = []

    def generate(self, prompts, sampling):
        self.calls.append(([len(p) for p in prompts], sampling.seed))
        return [Completion(list(p), [7], f"{len(p)}@{sampling.seed}", [-0.1], "eos") for p in prompts]


def test_every_sample_in_place_in_seeded_chunks_longest_first():
    engine = Recorder()
    prompts = [[1] * 2, [1] * 5, [1] * 3]
    texts = generate_stream(engine, prompts, SamplingParams(max_new_tokens=4, seed=10), samples=2)
    assert [lengths for lengths, _ in engine.calls] == [[5, 5, 3], [3, 2, 2]]
    assert [seed for _, seed in engine.calls] == [10, 11]
    assert texts == [["2@11", "2@11"], ["5@10", "5@10"], ["3@10", "3@11"]]
    unseeded = Recorder()
    generate_stream(unseeded, prompts, SamplingParams(max_new_tokens=4), chunk_size=2)
    assert [seed for _, seed in unseeded.calls] == [None, None]
    assert [lengths for lengths, _ in unseeded.calls] == [[5, 3], [2]]
