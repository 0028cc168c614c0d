"""Exploitability of the average strategies vs T for the three matrix-game dynamics, on
RPS and biased RPS, as one log-log PNG.

    python -m lmselfplay.solvers.plots --out DIR [--T 10000]

Iterated best response cycles rock -> paper -> scissors: its average happens to reach
the uniform equilibrium of RPS (exactly at multiples of 3), but stays at exploitability
2/3 in biased RPS. Fictitious play and regret matching converge in both.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from lmselfplay.solvers.matrix_games import (
    BIASED_RPS,
    RPS,
    best_response_dynamics,
    exploitability,
    fictitious_play_rounds,
    regret_matching_rounds,
    running_average,
)

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
        out[name] = exploitability(U, running_average(mus), running_average(nus))
    return out


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="output folder")
    ap.add_argument("--T", type=int, default=10000, help="rounds of each dynamics")
    args = ap.parse_args(argv)
    if args.T < 2:
        ap.error("--T must be at least 2")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    args.out.mkdir(parents=True, exist_ok=True)
    t = np.arange(1, args.T + 1)
    fig, axes = plt.subplots(1, len(GAMES), figsize=(6 * len(GAMES), 4.5), sharey=True)
    for ax, (title, U) in zip(np.atleast_1d(axes), GAMES.items()):
        for name, curve in exploitability_curves(U, args.T).items():
            # exact zeros (e.g. best response's average at multiples of 3) have no log
            ax.loglog(t, np.where(curve > 0, curve, np.nan), label=name, lw=1)
        D = float(U.max() - U.min())
        ax.loglog(t, 2 * D * np.sqrt(U.shape[0] / t), "k--", lw=0.8,
                  label=r"regret bound $2D\sqrt{m/T}$")
        ax.set_title(title)
        ax.set_xlabel("T (rounds)")
        ax.grid(True, which="both", alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("exploitability of the average strategies")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.tight_layout()
    path = args.out / "exploitability_vs_T.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
