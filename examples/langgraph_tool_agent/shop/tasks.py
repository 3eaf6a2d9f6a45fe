"""The shop tasks: an item, a quantity, a price table and a delivery fee of the episode's own; and which tasks
each phase uses.

A task asks for the cost of an order, `quantity` units of `item`, written as a ticket whose field names are
the tools' argument names (`user_message`); every item's price (1-9) and the delivery fee (1-9) are drawn from
the task's seed. The fee is known only to the `order_total` tool, so the total (quantity × price + fee) cannot
be worked out from the ticket and the price, nor memorised: the agent has to look the price up, ask
`order_total`, and copy its answer. The 72 (quantity, price)
pairs (quantity 2-9, price 1-9) are split once, whatever the run's seed:
  - held-out: `HELD_OUT_PAIRS` pairs, the only pairs of the held-out tasks, never in the warm start or RL,
    so a held-out total can only be right if it was read off the tools' outputs;
  - the rest: the pairs of the warm-start and the RL tasks, which draw from disjoint seed ranges.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

# Common words the tiny model's tokenizer writes in two tokens inside JSON ("pe" "ar"): the agent copies the
# item from the ticket into `lookup_price`, and the tiny model can learn that only for words it has seen.
ITEMS = ("apple", "pear", "tea", "rice", "egg", "bean", "fig", "nut")
QUANTITIES = tuple(range(2, 10))
PRICES = tuple(range(1, 10))
FEES = tuple(range(1, 10))
HELD_OUT_PAIRS = 20
SPLIT_SEED = 31
HELD_OUT_TASKS_PER_PAIR = 2

# Task seeds: a block per phase, in it a block per run seed (below _RUN_SEEDS), so no two draw the same task.
_SEED_BASE = {"warm_start": 0, "rl": 1_000_000_000, "held_out": 2_000_000_000}
_SEEDS_PER_RUN = 100_000
_RUN_SEEDS = 10_000

Pair = tuple[int, int]


def pair_split() -> tuple[list[Pair], list[Pair]]:
    """(training pairs, held-out pairs) of (quantity, price): disjoint, fixed, together all 72."""
    pairs = [(quantity, price) for quantity in QUANTITIES for price in PRICES]
    held_out = sorted(random.Random(SPLIT_SEED).sample(pairs, HELD_OUT_PAIRS))
    return [pair for pair in pairs if pair not in held_out], held_out


def make_task(seed: int, pairs: Sequence[Pair]) -> dict[str, Any]:
    """The task of one seed: a (quantity, price) pair drawn from `pairs`, an item, every item's price drawn from
    the seed (the item's own set to the pair's price), and the delivery fee."""
    rng = random.Random(seed)
    quantity, price = rng.choice(pairs)
    item = rng.choice(ITEMS)
    prices = {name: rng.choice(PRICES) for name in ITEMS}
    prices[item] = price
    fee = rng.choice(FEES)
    return {"id": f"shop-{seed}", "seed": seed, "item": item, "quantity": quantity, "prices": prices, "fee": fee}


def phase_tasks(phase: str, count: int, seed: int = 0) -> list[dict[str, Any]]:
    """`count` tasks of a phase, "warm_start" or "rl", on the training pairs; each phase and run seed draws from
    seeds of its own."""
    if phase not in ("warm_start", "rl"):
        raise ValueError(f"phase must be 'warm_start' or 'rl' (held-out tasks: held_out_tasks()), got {phase!r}")
    if not 0 <= count <= _SEEDS_PER_RUN:
        raise ValueError(f"count must be between 0 and {_SEEDS_PER_RUN}, got {count}")
    if not 0 <= seed < _RUN_SEEDS:
        raise ValueError(f"the run seed must be between 0 and {_RUN_SEEDS - 1}, got {seed}")
    training, _ = pair_split()
    first = _SEED_BASE[phase] + seed * _SEEDS_PER_RUN
    return [make_task(first + index, training) for index in range(count)]


def held_out_tasks() -> list[dict[str, Any]]:
    """The held-out tasks: each held-out pair `HELD_OUT_TASKS_PER_PAIR` times, the same whatever the run."""
    _, held_out = pair_split()
    first = _SEED_BASE["held_out"]
    return [make_task(first + index, [pair]) for index, pair in enumerate(held_out * HELD_OUT_TASKS_PER_PAIR)]


def total(task: dict[str, Any]) -> int:
    """What the order costs: quantity × the item's price + the delivery fee."""
    return int(task["quantity"]) * int(task["prices"][task["item"]]) + int(task["fee"])


def order_ticket(task: dict[str, Any]) -> str:
    """The order as a ticket: JSON whose fields are the tools' arguments, written as a tool call's arguments are
    (json.dumps' separators), e.g. '{"item": "pear", "quantity": 4}'."""
    return json.dumps({"item": task["item"], "quantity": task["quantity"]})


def user_message(task: dict[str, Any]) -> str:
    """The question the agent is asked: the order's ticket, and what it costs.

    Every value the agent writes is then found earlier in its context after the same tokens: `"item": "pear"`
    and `"quantity": 4` in the ticket, `"price": 7` in `lookup_price`'s result, "The total is 31." in
    `order_total`'s; a small transformer copies such a value by induction (the tokens before it seen before,
    followed by it)."""
    return f"Order: {order_ticket(task)}. What does it cost?"
