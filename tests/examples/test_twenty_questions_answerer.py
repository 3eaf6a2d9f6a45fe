"""The offline answerer on a table of free-text questions, and reading questions out of replies."""

from __future__ import annotations

import pytest
import twenty_questions_helpers  # noqa: F401  (puts the example on the import path)
from twenty_q.answerer import DeterministicAnswerer, guessed_name
from twenty_q.answerer_llm import OfflineAnswererLLM
from twenty_q.prompts import extract_question


@pytest.fixture(scope="module")
def answerer() -> DeterministicAnswerer:
    return DeterministicAnswerer()


@pytest.mark.parametrize(
    ("secret", "question", "expected", "correct"),
    [
        # kinds of thing, and the broad word losing to the specific one
        ("penguin", "Is it an animal?", "yes", False),
        ("penguin", "Is it a mammal?", "no", False),
        ("penguin", "Is it a bird?", "yes", False),
        ("penguin", "Can it fly?", "no", False),
        ("eagle", "Can it fly?", "yes", False),
        ("penguin", "Does it live in the water?", "yes", False),
        ("penguin", "Is it bigger than a breadbox?", "yes", False),
        ("bee", "Can you hold it in your hand?", "yes", False),
        ("dog", "Does it have legs?", "yes", False),
        ("dolphin", "Does it have legs?", "no", False),
        ("chair", "Does it have legs?", "yes", False),
        ("lion", "Is it a wild animal?", "yes", False),
        ("cow", "Is it a farm animal?", "yes", False),
        ("harp", "Is it a brass instrument?", "no", False),
        ("trumpet", "Is it a brass instrument?", "yes", False),
        ("harp", "Is it a musical instrument?", "yes", False),
        ("violin", "Is it played with a bow?", "yes", False),
        # people: alive vs living, nationality, roles
        ("Barack Obama", "Is he alive?", "yes", False),
        ("Albert Einstein", "Is he still alive?", "no", False),
        ("Albert Einstein", "Is it a living thing?", "no", False),
        ("Barack Obama", "Is he American?", "yes", False),
        ("Barack Obama", "Was he a president?", "yes", False),
        ("Marie Curie", "Is it a woman?", "yes", False),
        ("Marie Curie", "Did she win a Nobel Prize?", "yes", False),
        ("Taylor Swift", "Is she a singer?", "yes", False),
        ("Barack Obama", "Is it a man-made object?", "no", False),
        # fictional characters
        ("Batman", "Is it a fictional character?", "yes", False),
        ("Batman", "Is it real?", "no", False),
        ("Batman", "Does he have superpowers?", "no", False),
        ("Superman", "Does he have superpowers?", "yes", False),
        ("Elsa", "Is she from a Disney movie?", "yes", False),
        # objects, flowers
        ("stapler", "Is it used in an office?", "yes", False),
        ("stapler", "Is it made of metal?", "yes", False),
        ("sofa", "Can you sit on it?", "yes", False),
        ("refrigerator", "Does it keep things cold?", "yes", False),
        ("smartphone", "Does it have a screen?", "yes", False),
        ("rose", "Does it have thorns?", "yes", False),
        ("tulip", "Is it associated with the Netherlands?", "yes", False),
        ("sunflower", "Is it yellow?", "yes", False),
        # does not apply, or cannot be read: n/a
        ("stapler", "Is it red?", "n/a", False),
        ("stapler", "Does it have fur?", "n/a", False),
        ("dog", "asdf qwerty?", "n/a", False),
        ("dog", "", "n/a", False),
        # guesses: the name or an alias wins; another entity is a no
        ("penguin", "Is it a penguin?", "yes", True),
        ("penguin", "Is it an eagle?", "no", False),
        ("smartphone", "Is it a phone?", "yes", True),
        ("Barack Obama", "Is it Obama?", "yes", True),
        ("Spider-Man", "Are you thinking of Spider Man?", "yes", True),
        ("polar bear", "Is it a polar bear?", "yes", True),
        ("dog", "Is it a penguin or a dog or a cat?", "n/a", False),  # listing names is no guess
    ],
)
def test_answers(answerer: DeterministicAnswerer, secret: str, question: str, expected: str, correct: bool) -> None:
    response = answerer.answer(secret, question)
    assert (response.yes_or_no, response.correct) == (expected, correct), response.brief_reason


def test_an_unknown_secret_gets_na(answerer: DeterministicAnswerer) -> None:
    assert answerer.answer("unicorn", "Is it an animal?").yes_or_no == "n/a"


def test_guessed_name() -> None:
    assert guessed_name("Is it a polar bear?") == "polar bear"
    assert guessed_name("Could it be the Eiffel Tower?") == "eiffel tower"
    assert guessed_name("Does it have fur?") is None


def test_the_offline_llm_reads_its_prompt_and_answers_in_crewai_format() -> None:
    llm = OfflineAnswererLLM()
    text = llm.call(
        [
            {"role": "system", "content": "You answer."},
            {"role": "user", "content": "Secret: harp\nCategory: instruments\nQuestion: Does it have strings?"},
        ]
    )
    assert text.startswith("Thought:") and '"yes_or_no":"yes"' in text.replace(" ", "")
    with pytest.raises(ValueError, match="Secret"):
        llm.call("no markers here")


@pytest.mark.parametrize(
    ("reply", "question"),
    [
        ("Is it an animal?", "Is it an animal?"),
        ("Thought: start broad\nFinal Answer: Is it alive?", "Is it alive?"),
        ("Hmm. Is it bigger than a breadbox? I wonder.", "Is it bigger than a breadbox?"),
        ("Thought: I think so\nFinal Answer: It is a cat.", None),
        ("cardboard floated whispered", None),
        ("??", None),
        ("", None),
        (None, None),
    ],
)
def test_extract_question(reply: str | None, question: str | None) -> None:
    assert extract_question(reply) == question
