"""Where does a policy fail? P(optimal move) of a saved model at every decision position of a
game the exact solver labels (``exact_metric == "optimal_moves"``), worst first.

    python benchmarks/position_probs.py MODEL [MODEL ...] [--game nim] [--show 8] [--name NAME]

Printed per model: the positions with the lowest P(optimal) (teacher-forced answer
probabilities normalized over the legal moves, as the self-play evaluations read them), the
optimal moves and the model's distribution; all positions go to ``benchmarks/results/NAME.json``
when ``--name`` is given.
"""

from __future__ import annotations

import argparse

from lmselfplay.utils.results import save_results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--game", default="nim")
    ap.add_argument("--show", type=int, default=8, help="worst positions printed per model")
    ap.add_argument("--name", default=None)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lmselfplay.games import make
    from lmselfplay.games.base import OPTIMAL_MOVES
    from lmselfplay.games.solve import optimal_actions
    from lmselfplay.lm.engines import HFEngine
    from lmselfplay.lm.readout import answer_distribution, decision_states

    game = make(args.game)
    if game.exact_metric != OPTIMAL_MOVES:
        raise SystemExit(f"{args.game} has no exact optimal moves (exact_metric {game.exact_metric!r})")
    states = decision_states(game)
    out = {}
    for path in args.models:
        model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
        dist = answer_distribution(HFEngine(model, tok), tok, game, states)
        rows = []
        for s, d in zip(states, dist):
            opt = optimal_actions(game, s)
            rows.append({"position": game.render(s), "player": game.current_player(s),
                         "optimal": [game.action_text(a) for a in opt], "p_optimal": sum(d[a] for a in opt),
                         "dist": {game.action_text(a): p for a, p in sorted(d.items())}})
        rows.sort(key=lambda r: r["p_optimal"])
        out[path] = rows
        print(f"\n{path}: mean P(optimal) {sum(r['p_optimal'] for r in rows) / len(rows):.3f} over {len(rows)} positions")
        for r in rows[: args.show]:
            dist_text = " ".join(f"{a}:{p:.2f}" for a, p in r["dist"].items())
            print(f"  P(opt) {r['p_optimal']:.3f}  player {r['player'] + 1}  {r['position']!r}  optimal {r['optimal']}"
                  f"  model {dist_text}")
    if args.name:
        print(f"results: {save_results(args.name, {'game': args.game, 'models': out})}")


if __name__ == "__main__":
    main()
