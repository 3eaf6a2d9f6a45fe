"""Helpers of the algorithm tests: random trajectories (several segments, masked observations, random groups)."""

from __future__ import annotations

import random

from agl_bridge.convert import SegmentCall, Trajectory, TrajectorySegment


def random_segment(rng: random.Random, *, calls: int = 2) -> TrajectorySegment:
    """A segment of `calls` turns: a prompt or observation (mask 0), then a sampled response (mask 1) per turn."""
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    spans = []
    for _ in range(calls):
        observation = rng.randint(1, 4)
        ids += [rng.randint(10, 500) for _ in range(observation)]
        mask += [0] * observation
        logprobs += [0.0] * observation
        response = rng.randint(1, 6)
        start = len(ids)
        ids += [rng.randint(10, 500) for _ in range(response)]
        mask += [1] * response
        logprobs += [-rng.random() * 3 for _ in range(response)]
        spans.append((start, len(ids)))
    return TrajectorySegment(
        input_ids=ids,
        loss_mask=mask,
        sampler_logprobs=logprobs,
        policy_versions=[0 if m else -1 for m in mask],
        model="tiny",
        calls=[
            SegmentCall(sequence=i, choice_index=0, response_start=a, response_end=b) for i, (a, b) in enumerate(spans)
        ],
    )


def random_trajectories(seed: int, groups: int = 4, sizes: tuple[int, ...] = (1, 2, 3, 5)) -> list[Trajectory]:
    """Groups of random sizes (a group of one included), rewards with ties, one to three segments each."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        size = sizes[g % len(sizes)]
        flat = g == groups - 1  # one group of equal returns
        for member in range(size):
            # Two distinct returns first, then ties are likely: 0, 1, then any of 0 / 0.25 / 1 / a random one.
            reward = (
                0.5 if flat else [0.0, 1.0][member] if member < 2 else rng.choice([0.0, 0.25, 1.0, rng.uniform(-2, 2)])
            )
            segments = [random_segment(rng, calls=rng.randint(1, 3)) for _ in range(rng.randint(1, 3))]
            out.append(
                Trajectory(
                    rollout_id=f"r{g}-{member}",
                    attempt_id=f"a{g}-{member}",
                    group_id=f"g{g}",
                    reward=reward,
                    segments=segments,
                )
            )
    rng.shuffle(out)
    return out
