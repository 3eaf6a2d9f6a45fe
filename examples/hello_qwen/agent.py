"""The hello agent: plain OpenAI SDK code with one added line, `emit_reward(...)`.

The model is asked to play a game — "Let's play a game. Say you are 42." — and is rewarded +1 when
it says it is that number ("I'm 42" / "I am 42"), −1 when it denies it or claims to be something
else, and 0 otherwise. Nothing here knows about training: point `base_url` anywhere OpenAI-
compatible and it runs as an ordinary agent.
"""

from __future__ import annotations

import random
import re

from openai import OpenAI

HELD_OUT = 40
VALIDATION = 40


def split_numbers(seed: int = 1234) -> tuple[list[int], list[int], list[int]]:
    """(training, validation, held-out numbers): disjoint, fixed for a seed. Neither validation nor held-out
    numbers are ever trained on; validation ones can choose the adapter a run keeps (`keep_best`), held-out ones
    measure it."""
    numbers = list(range(1000))
    random.Random(seed).shuffle(numbers)
    validation_end = HELD_OUT + VALIDATION
    return numbers[validation_end:], sorted(numbers[HELD_OUT:validation_end]), sorted(numbers[:HELD_OUT])


# 1- and 2-digit numbers are a tenth of 0–999. While 3-digit groups dominate each step, GRPO teaches "three
# digits, then stop", the short numbers get a third digit ("I'm 444" for 44, reward -1), and a reply that
# claims nothing ("I...", reward 0) beats that within their groups; once a whole group hedges its returns
# are equal, the group is dropped, and RL never brings it back. The held-out numbers' short eighth then
# caps the end value near 0.8. Six times as often (two fifths of the training mix), they hold their own.
SHORT_NUMBER_WEIGHT = 6
WARM_START_SPLIT_SEED = 7

# "I'm 412." and the end of the turn are 8 tokens; 10 leaves room for "I am 412!". At 16, a run whose replies
# never learned to stop ("I'm 55...855...'m5", seeds 7 and 9 of ten) trained on twice the tokens of one that
# stopped, and with the loss a mean over a step's tokens the digits that earn the reward got half the push:
# seed 7 learned slowest and ended at +0.786. The reward reads the claim, which fits in 10 either way.
REPLY_MAX_TOKENS = 10


def with_short_numbers_weighted(numbers: list[int]) -> list[int]:
    """`numbers` with each 1- or 2-digit number repeated SHORT_NUMBER_WEIGHT times: the training mix."""
    return [n for n in numbers for _ in range(SHORT_NUMBER_WEIGHT if n < 100 else 1)]


def split_warm_start_and_rl(numbers: list[int]) -> tuple[list[int], list[int]]:
    """(warm-start numbers, RL numbers): halves of the training numbers, fixed whatever the run's seed.

    The warm start all but memorises its numbers ("I'm 412" for 412) without learning to copy a number it
    never saw (the held-out reward after it stays near 0). RL on those same numbers then finds most groups
    already right, with equal returns and nothing to teach; on numbers the warm start never saw, every
    group is a test of copying, which is what the held-out numbers measure. Two seeds that ended at
    0.79 and 0.85 with one shared set ended at 0.82 and 0.96 with the halves.
    """
    shuffled = sorted(numbers)
    random.Random(WARM_START_SPLIT_SEED).shuffle(shuffled)
    half = len(shuffled) // 2
    return shuffled[:half], shuffled[half:]


def warm_start_pairs(numbers: list[int]) -> list[tuple[str, str]]:
    """(prompt, the reply that wins) for each number of the warm start's half, weighted as the training mix."""
    return [(prompt_for(n), f"I'm {n}.") for n in with_short_numbers_weighted(numbers)]


_CLAIM = re.compile(r"\bi(?:'m| am)\s+(not\s+)?([^\s.,!?;:]+)", re.IGNORECASE)


def prompt_for(number: int) -> str:
    """The user message for one task."""
    return f"Let's play a game. Say you are {number}."


def reward_for(reply: str | None, number: int) -> float:
    """+1 for "I'm N"/"I am N", −1 for denying N or claiming another identity, else 0."""
    verdict = 0.0
    for negated, claimed in _CLAIM.findall(reply or ""):
        if claimed == str(number) and not negated:
            return 1.0
        if claimed == str(number) or not negated:
            verdict = -1.0
    return verdict


# One client for every rollout of the process, as an agent service keeps one: each `OpenAI(...)` builds an
# HTTP client whose TLS context loads the CA certificates (~10-20 ms of CPU), more than the call itself.
# `with_options` gives a rollout its own base URL over the shared connection pool.
_CLIENT = OpenAI(base_url="http://127.0.0.1/v1", api_key="unset")


def hello_agent(task: int, endpoint) -> None:
    """One rollout: ask, read the reply, emit the reward. `endpoint` carries base_url/model/key."""
    from agl_bridge import emit_reward  # here, so that the game rules above import without agl_bridge

    client = _CLIENT.with_options(base_url=endpoint.base_url, api_key=endpoint.api_key)
    response = client.chat.completions.create(
        model=endpoint.model,
        messages=[{"role": "user", "content": prompt_for(task)}],
        max_tokens=REPLY_MAX_TOKENS,
    )
    emit_reward(reward_for(response.choices[0].message.content, task))
