"""One-pile Nim's closed-form solution against a full minimax search, normal and misère play."""

import pytest

from lmselfplay.games.nim import Nim
from lmselfplay.games.solve import Minimax


@pytest.mark.parametrize("misere", [False, True])
@pytest.mark.parametrize("max_take", [2, 3])
def test_closed_form_values_and_optimal_moves_equal_minimax(max_take, misere):
    game = Nim(start=13, max_take=max_take, misere=misere)
    search = Minimax(game)
    for stones in range(1, 14):
        for player in (0, 1):
            s = game.state_with(stones, player)
            assert game.value(s) == search.value(s), (stones, player)
            assert game.optimal_actions(s) == search.optimal_actions(s), (stones, player)


def test_who_takes_the_last_stone_and_illegal_moves():
    normal, misere = Nim(start=3), Nim(start=3, misere=True)
    for game, winner in ((normal, 0), (misere, 1)):
        end = game.apply(game.new_initial_state(), 2)  # player 0 takes all three
        assert game.is_terminal(end) and game.returns(end)[winner] == 1.0
    with pytest.raises(ValueError, match="illegal nim action 3 with 3 stones"):
        normal.apply(normal.new_initial_state(), 3)
    with pytest.raises(ValueError, match="start >= 1"):
        Nim(start=0)
