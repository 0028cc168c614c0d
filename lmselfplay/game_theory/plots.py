"""Exploitability of the average strategies vs T for the three matrix-game dynamics, on
RPS and biased RPS, as one log-log PNG.

    python -m lmselfplay.game_theory.plots --out DIR [--T 10000]

Iterated best response cycles rock -> paper -> scissors: its average happens to reach
the uniform equilibrium of RPS (exactly at multiples of 3), but stays at exploitability
2/3 in biased RPS. Fictitious play and regret matching converge in both.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from lmselfplay.game_theory.matrix_games import (
    BIASED_RPS,
    RPS,
    best_response_dynamics,
    fictitious_play_rounds,
    matrix_exploitability,
    regret_matching_rounds,
    running_average,
)
from lmselfplay.utils.curves import Line, plot_lines

GAMES = {"rock-paper-scissors": RPS, "biased RPS (rock beats scissors pays 2)": BIASED_RPS}
DYNAMICS = {
    "iterated best response": best_response_dynamics,
    "fictitious play": fictitious_play_rounds,
    "regret matching": lambda U, T: regret_matching_rounds(U, T)[:2],
}


def exploitability_curves(U, T: int) -> dict[str, np.ndarray]:
    """For each dynamics, exploitability of the averages of rounds 1..t, t = 1..T."""
    out = {}
    for name, dynamics in DYNAMICS.items():
        mus, nus = dynamics(U, T)
        out[name] = matrix_exploitability(U, running_average(mus), running_average(nus))
    return out


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="output folder")
    ap.add_argument("--T", type=int, default=10000, help="rounds of each dynamics")
    args = ap.parse_args(argv)
    if args.T < 2:
        ap.error("--T must be at least 2")

    args.out.mkdir(parents=True, exist_ok=True)
    t = np.arange(1, args.T + 1)
    keys = {title: f"{title}/exploitability" for title in GAMES}
    panels = {}
    for title, U in GAMES.items():
        panels[keys[title]] = [
            # exact zeros (e.g. best response's average at multiples of 3) have no log
            Line(name, [(x, y) for x, y in zip(t.tolist(), curve.tolist()) if y > 0])
            for name, curve in exploitability_curves(U, args.T).items()]
        D = float(U.max() - U.min())
        bound = 2 * D * np.sqrt(U.shape[0] / t)
        panels[keys[title]].append(Line(r"regret bound $2D\sqrt{m/T}$", list(zip(t.tolist(), bound.tolist())),
                                        style="--"))
    path = plot_lines(panels, args.out / "exploitability_vs_T.png", columns=len(GAMES), log=True,
                      xlabel="T (rounds)", titles={title: title for title in GAMES},
                      title="Exploitability of the average strategies (a Nash equilibrium has 0)")
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
