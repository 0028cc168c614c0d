"""The AlphaZero win-rate matrix figure: rows of growing length (checkpoint i against each
earlier one) become a square matrix whose cells on and above the diagonal are empty."""

import math

from lmselfplay.alphazero import plots


def test_the_matrix_is_padded_with_empty_cells_and_drawn(tmp_path, monkeypatch):
    seen, real = {}, plots.heatmap

    def recording(m, rows, columns, path, title, **kw):
        seen.update(m=m, rows=rows, columns=columns)
        return real(m, rows, columns, path, title, **kw)

    monkeypatch.setattr(plots, "heatmap", recording)
    plots.plot_matrix([[], [0.75], [0.5, 1.0]], tmp_path / "m.png")
    m = seen["m"]
    assert m.shape == (3, 3) and seen["rows"] == seen["columns"] == ["0", "1", "2"]
    assert m[1, 0] == 0.75 and m[2, 0] == 0.5 and m[2, 1] == 1.0
    assert all(math.isnan(m[i, j]) for i in range(3) for j in range(i, 3))
    assert (tmp_path / "m.png").stat().st_size > 1000
