"""A game's reward: 1 for a won game less the optional cost per turn, 0 for a lost one; a cost that could
make a win worth 0 or less is refused where it is set."""

from __future__ import annotations

import pytest
import twenty_questions_helpers  # noqa: F401  (puts the example on the import path)
from twenty_q.reward import check_turn_cost, game_reward, turn_cost_from_env
from twenty_q.state import GameState


def game(turns: int, guessed: bool, max_turns: int = 8) -> GameState:
    return GameState(secret="dog", category="animals", max_turns=max_turns, turn=turns, guessed=guessed)


@pytest.mark.parametrize(
    ("turns", "guessed", "turn_cost", "reward"),
    [
        (1, True, 0.05, 1.0),
        (3, True, 0.05, 0.9),
        (8, True, 0.05, 0.65),
        (8, True, 0.0, 1.0),
        (3, True, 0.0, 1.0),
        (8, False, 0.05, 0.0),
        (2, False, 0.0, 0.0),
    ],
)
def test_a_won_game_earns_less_the_more_turns_it_took_and_a_lost_one_nothing(
    turns: int, guessed: bool, turn_cost: float, reward: float
) -> None:
    assert game_reward(game(turns, guessed), turn_cost) == pytest.approx(reward)


def test_a_cost_that_would_make_a_win_worth_nothing_is_refused_with_the_range() -> None:
    check_turn_cost(0.14, 8)
    with pytest.raises(ValueError, match=r"below 1 / 7 \(games of 8 turns\)"):
        check_turn_cost(1 / 7, 8)
    with pytest.raises(ValueError, match="at least 0"):
        game_reward(game(2, True), -0.01)
    with pytest.raises(ValueError, match=r"below 1 / 19"):
        game_reward(game(2, True, max_turns=20), 0.06)  # the classic game's 20 turns


def test_the_cost_is_read_from_the_environment_and_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TWENTYQ_TURN_COST", raising=False)
    assert turn_cost_from_env() == 0.0
    monkeypatch.setenv("TWENTYQ_TURN_COST", "0.05")
    assert turn_cost_from_env() == 0.05
    monkeypatch.setenv("TWENTYQ_TURN_COST", "five cents")
    with pytest.raises(ValueError, match="TWENTYQ_TURN_COST must be a number .* got 'five cents'"):
        turn_cost_from_env()


def test_learn_py_refuses_a_turn_cost_out_of_range_before_it_starts(capsys: pytest.CaptureFixture[str]) -> None:
    import learn

    assert learn.parse_args([]).turn_cost == 0.05
    with pytest.raises(SystemExit) as exit_info:
        learn.parse_args(["--turn-cost", "0.2"])
    assert exit_info.value.code == 2
    assert "turn cost 0.2 out of range" in capsys.readouterr().err
