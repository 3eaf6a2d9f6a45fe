"""The learning setup on the tiny model: which entities the warm start, RL and the evaluation use, and the
candidate list each game shows.

The tiny model knows nothing about the world, so every game names the candidates the secret is among
(`CANDIDATES` names of its category, in a random order) and lasts `MAX_TURNS` turns. The 25 entities of
a category are split once, whatever the run's seed:
  - warm start: 12 of the 20 training entities: secrets and the other names of warm-start games;
  - RL: the other 8 training entities as secrets, among any training names;
  - held-out: the 5 test entities as secrets, among any names of the category. They are never a secret
    nor a name in the warm start or RL.
RL entities are kept out of the warm start for the reason `examples/hello_qwen` found: on games the warm
start has already memorised every rollout of a group wins, the returns are equal and RL has nothing to
learn; on unfamiliar names every group tests what the held-out games measure.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from twenty_q.data import CATEGORIES, Entity, EntityTable, default_table

CANDIDATES = 8
MAX_TURNS = 8
WARM_START_PER_CATEGORY = 12
SPLIT_SEED = 7


def learning_split(table: EntityTable | None = None) -> tuple[list[Entity], list[Entity], list[Entity]]:
    """(warm-start, RL, held-out) entities: disjoint, fixed for the bundled table."""
    table = table or default_table()
    warm: list[Entity] = []
    rl: list[Entity] = []
    for category in CATEGORIES:
        train = sorted(table.split("train", category), key=lambda e: e.name)
        random.Random(f"{SPLIT_SEED}:{category}").shuffle(train)
        warm += train[:WARM_START_PER_CATEGORY]
        rl += train[WARM_START_PER_CATEGORY:]
    return warm, rl, table.split("test")


def game_task(secret: Entity, names: Sequence[Entity], rng: random.Random) -> dict[str, object]:
    """A task: the secret among CANDIDATES names of its category (itself and others drawn from `names`), shuffled."""
    others = sorted({e.name for e in names if e.category == secret.category and e.name != secret.name})
    candidates = [*rng.sample(others, CANDIDATES - 1), secret.name]
    rng.shuffle(candidates)
    return {"secret": secret.name, "category": secret.category, "candidates": candidates}


def phase_tasks(phase: str, games_per_secret: int, seed: int = 0) -> list[dict[str, object]]:
    """The tasks of one phase ("warm_start", "rl" or "held_out"): `games_per_secret` candidate lists per secret."""
    warm, rl, held_out = learning_split()
    secrets, names = {
        "warm_start": (warm, warm),
        "rl": (rl, warm + rl),
        "held_out": (held_out, warm + rl + held_out),
    }[phase]
    rng = random.Random(f"{phase}:{seed}")
    return [game_task(secret, names, rng) for _ in range(games_per_secret) for secret in secrets]


def position_balanced(tasks: Sequence[dict[str, object]], seed: int) -> list[dict[str, object]]:
    """`tasks` in a seeded order, each with its secret moved (trading places with the name listed there) so that
    every `CANDIDATES` consecutive tasks have their secrets at list positions 1 … `CANDIDATES`, once each.

    RL takes them in this order (`shuffle_tasks = False`), so a batch of 8 holds every position once. Why: a
    GRPO group learns only where some of its games win. In a group whose secret is listed late, the games that
    win are those that skipped ahead through the list (counting ones run out of turns), while a group whose
    secret is early and whose games all skipped past it loses every game and teaches nothing. Random batches
    can draw several late positions in a row (seed 2's step 4 drew four seventh-position secrets, step 6 four
    again) and the policy learns to skip: "1 4 4 4 7 7 7".
    """
    rng = random.Random(f"positions:{seed}")
    order = list(tasks)
    rng.shuffle(order)
    balanced = []
    for start in range(0, len(order), CANDIDATES):
        block = order[start : start + CANDIDATES]
        for task, position in zip(block, rng.sample(range(CANDIDATES), len(block)), strict=True):
            candidates = list(task["candidates"])  # type: ignore[call-overload]
            here = candidates.index(task["secret"])
            candidates[here], candidates[position] = candidates[position], candidates[here]
            balanced.append({**task, "candidates": candidates})
    return balanced


def held_out_tasks(balanced: bool = True) -> list[dict[str, object]]:
    """The held-out evaluation's lists: 2 per held-out secret (80), the same whatever the run's seed.

    balanced: each list position holds the secret in 10 of them (`position_balanced`), so success is averaged
    over where a secret can be listed. The lists as drawn (balanced False, the README's older runs) put it
    first in 14 of 80 and seventh in 3: a player that finds early secrets and misses late ones scored high.
    """
    tasks = phase_tasks("held_out", 2)
    return position_balanced(tasks, seed=0) if balanced else tasks


_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def made_up_name(rng: random.Random) -> str:
    """A pronounceable name no entity has ("Tavoki"): two or three consonant-vowel syllables."""
    syllables = rng.choice((2, 3))
    return "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(syllables)).capitalize()


def with_made_up_names(
    tasks: Sequence[dict[str, object]], rate: float, rng: random.Random, table: EntityTable | None = None
) -> tuple[list[dict[str, object]], EntityTable]:
    """`tasks` with each candidate renamed to a made-up name with probability `rate`, and the table that knows
    the new names (each with the attributes of the entity it renames).

    A name seen in one game only cannot be memorised: guessing it means copying it from the list, the skill
    that held-out names need.
    """
    table = table or default_table()
    entities = list(table.entities)
    attributes = dict(table.attributes)
    taken = {e.name.lower() for e in entities}
    renamed_tasks = []
    for task in tasks:
        renames: dict[str, str] = {}
        for name in task["candidates"]:  # type: ignore[union-attr]
            if rng.random() >= rate:
                continue
            new = made_up_name(rng)
            while new.lower() in taken:
                new = made_up_name(rng)
            taken.add(new.lower())
            entity = table.get(str(name))
            assert entity is not None
            entities.append(Entity(new, entity.category, entity.split))
            attributes[new.lower()] = attributes[entity.name.lower()]
            renames[str(name)] = new
        renamed_tasks.append(
            {
                **task,
                "secret": renames.get(str(task["secret"]), task["secret"]),
                "candidates": [renames.get(str(n), n) for n in task["candidates"]],  # type: ignore[union-attr]
            }
        )
    return renamed_tasks, EntityTable(entities, attributes, table.attribute_names)
