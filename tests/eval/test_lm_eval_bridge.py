"""The lm-eval bridge on local tasks (tests/data/lmeval) with a tiny model built from config:
its log-likelihoods are the engine's teacher-forced scores."""

from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402
from lm_fixtures import tiny_model, tiny_tokenizer  # noqa: E402

from lmselfplay.eval.lm_eval_bridge import LMSelfPlay, cut_at_stop  # noqa: E402
from lmselfplay.lm.engines.hf import HFEngine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lm():
    tok = tiny_tokenizer()
    return LMSelfPlay(engine=HFEngine(tiny_model(seed=3), tok, max_batch_size=8), tokenizer=tok)


def _req(kind, args, i=0):
    return Instance(request_type=kind, doc={}, arguments=args, idx=i)


def test_registered_under_lmselfplay():
    assert get_model("lmselfplay") is LMSelfPlay


def test_simple_evaluate_on_local_tasks(lm, monkeypatch):
    monkeypatch.chdir(ROOT)  # the task YAMLs name their JSONL relative to the repo root
    res = lm_eval.simple_evaluate(model=lm, tasks=["lmselfplay_tiny_mc", "lmselfplay_tiny_gen"],
                                  task_manager=TaskManager(include_path=str(ROOT / "tests/data/lmeval"),
                                                           include_defaults=False),
                                  log_samples=True)
    samples = res["samples"]["lmselfplay_tiny_mc"]
    assert len(samples) == 4
    tok, eng = lm.tok, lm.engine
    hits = 0
    for s in samples:
        values = []
        for (context, continuation), resp in zip(s["arguments"], s["resps"]):
            # the engine's own score of the same tokens, computed independently here
            ctx_ids = tok(context, add_special_tokens=False)["input_ids"]
            whole = tok(context + continuation, add_special_tokens=False)["input_ids"]
            want = sum(eng.score([[tok.bos_token_id] + ctx_ids], [whole[len(ctx_ids):]])[0])
            assert resp[0][0] == pytest.approx(want, abs=1e-5)
            values.append(resp[0][0])
        hits += max(range(len(values)), key=values.__getitem__) == s["target"]
    assert res["results"]["lmselfplay_tiny_mc"]["acc,none"] == pytest.approx(hits / 4)
    gen = res["samples"]["lmselfplay_tiny_gen"]
    assert len(gen) == 3 and all("\n" not in s["resps"][0][0] for s in gen)


def test_loglikelihood_is_greedy_flag(lm):
    tok, eng = lm.tok, lm.engine
    ctx = "Nim: 5 stones"
    from lmselfplay.lm.engines.base import SamplingParams

    ids = [tok.bos_token_id] + tok(ctx, add_special_tokens=False)["input_ids"]
    g = eng.generate([ids], SamplingParams(max_new_tokens=3, temperature=0.0))[0]
    greedy_text = tok.decode(g.token_ids, skip_special_tokens=True)
    (lp_g, is_g), (lp_o, is_o) = lm.loglikelihood([_req("loglikelihood", (ctx, greedy_text)),
                                                   _req("loglikelihood", (ctx, " zzz"))])
    assert is_g and not is_o
    assert lp_g == pytest.approx(sum(g.logprobs), abs=1e-5)


def test_loglikelihood_rolling_sums_windows(lm):
    tok, eng = lm.tok, lm.engine
    text = "Tic-tac-toe board:\nX . O\n. X .\n. . O\n" * 40
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > lm.max_length  # several windows
    (total,) = lm.loglikelihood_rolling([_req("loglikelihood_rolling", (text,))])
    # lm-eval's disjoint windows: ids[start:end] is scored given the (up to) max_length
    # tokens of [BOS] + ids that end where the window ends
    want = 0.0
    seq = [tok.bos_token_id] + ids
    for start in range(0, len(ids), lm.max_length):
        end = min(start + lm.max_length, len(ids))
        ctx = seq[max(0, end - lm.max_length):start + 1]
        want += sum(eng.score([ctx], [ids[start:end]])[0])
    assert total == pytest.approx(want, abs=1e-4)
    short = "X . O"
    (t2,) = lm.loglikelihood_rolling([_req("loglikelihood_rolling", (short,))])
    sids = tok(short, add_special_tokens=False)["input_ids"]
    assert t2 == pytest.approx(sum(eng.score([[tok.bos_token_id]], [sids])[0]), abs=1e-5)


def test_generate_until_cuts_at_stop(lm):
    outs = lm.generate_until([_req("generate_until", ("Nim:", {"until": ["\n"], "max_gen_toks": 6})),
                              _req("generate_until", ("Nim:", {"until": "o", "max_gen_toks": 6}))])
    assert len(outs) == 2 and "\n" not in outs[0] and "o" not in outs[1]
    assert cut_at_stop("abc\ndef", ["\n", "b"]) == "a"


@pytest.mark.slow  # lm-eval's CLI indexes its 1,000+ bundled task configs first
def test_lm_eval_cli_with_model_lmselfplay(tmp_path, monkeypatch, capsys):
    from lm_fixtures import save_tiny

    from lmselfplay.cli import main as cli_main

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr("sys.argv", ["lmselfplay"])  # lm-eval's CLI reads sys.argv
    model_dir = save_tiny(tmp_path / "model")
    out = tmp_path / "out"
    assert cli_main(["lm-eval", "--model", "lmselfplay", "--model_args", f"pretrained={model_dir}",
                     "--batch_size", "8", "--device", "cpu", "--tasks", "lmselfplay_tiny_mc",
                     "--include_path", "tests/data/lmeval", "--output_path", str(out)]) == 0
    assert "lmselfplay_tiny_mc" in capsys.readouterr().out
    assert list(out.rglob("results_*.json"))


def test_apply_chat_template_of_one_user_turn_is_the_projects_formatter(lm):
    from lmselfplay.lm.prompt import format_prompt

    assert lm.apply_chat_template([{"role": "user", "content": "2 + 2?"}]) == format_prompt(lm.tok, "2 + 2?")
