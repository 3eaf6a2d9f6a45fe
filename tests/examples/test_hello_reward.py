"""The hello example's reward: claims of the task's number, denials, other identities."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "hello_qwen"))
from agent import prompt_for, reward_for


@pytest.mark.parametrize(
    ("reply", "number", "expected"),
    [
        ("I'm 42!", 42, 1.0),
        ("i am 42.", 42, 1.0),
        ("Sure, I AM 42", 42, 1.0),
        ("Okay. I'm 42, hello", 42, 1.0),
        ("I'm not 42.", 42, -1.0),
        ("I am not 42", 42, -1.0),
        ("I'm 43.", 42, -1.0),
        ("I am a robot.", 42, -1.0),
        ("I'm 420", 42, -1.0),
        ("42 is a number", 42, 0.0),
        ("", 42, 0.0),
        (None, 7, 0.0),
        ("I am not a robot", 7, 0.0),
        ("I'm 7. I am not 8", 7, 1.0),
    ],
)
def test_reward(reply: str | None, number: int, expected: float) -> None:
    assert reward_for(reply, number) == expected


def test_prompt() -> None:
    assert prompt_for(5) == "Let's play a game. Say you are 5."
