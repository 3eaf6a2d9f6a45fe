"""DPO (`mode = "dpo"`): preference pairs trained with the DPO loss through `forward_backward_custom`.

Pairs come from `dpo.data`: a JSONL file of {"prompt": str or messages, "chosen": str, "rejected":
str} records (each side chat-templated as the warm start does: the prompt masked, the response and
end-of-turn trained), or a store (.sqlite), whose groups give one pair each — the best and the worst
rollout by return (groups whose returns are all equal give none), with the exact token ids, masks
and segments the converter makes. The reference policy is the base model (the LoRA disabled), scored
once per pair. Each step takes `batch_size` pairs in a seeded order (`TaskSchedule`), so a resumed
run repeats and skips nothing; it logs the DPO loss, accuracy (the share of pairs whose implicit
reward margin is positive), the margin and both implicit rewards.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from agl_bridge.chat import ChatCodec
from agl_bridge.convert import ConvertOptions, Trajectory, convert_store, group_trajectories
from agl_bridge.errors import ConfigError
from agl_bridge.models.loading import load_tokenizer, resolve_model_path
from agl_bridge.primitives.datum import Datum
from agl_bridge.primitives.losses import DPO_CHOSEN, DPO_PAIR, DPO_REF_LOGPROBS, dpo_loss
from agl_bridge.runner import TaskSchedule, load_tasks
from agl_bridge.store.sqlite import SQLiteStore
from agl_bridge.train.config import GRPOConfig
from agl_bridge.train.loop_state import resume_latest, save_checkpoint
from agl_bridge.train.run_log import RunLog, RunSummary
from agl_bridge.train.step import StepSettings, adam_params, run_client, train_step
from agl_bridge.train.warm_start import sft_datum

STORE_SUFFIXES = (".sqlite", ".db", ".sqlite3")


@dataclass
class PreferencePair:
    """One preference: the datums of the chosen and of the rejected answer (one per token sequence)."""

    chosen: list[Datum]
    rejected: list[Datum]


def pairs_from_jsonl(path: str, tokenizer: object) -> list[PreferencePair]:
    """The pairs of a JSONL file of {"prompt", "chosen", "rejected"} records; ConfigError naming a bad record."""
    codec = ChatCodec(tokenizer)
    pairs = []
    for index, record in enumerate(load_tasks(path), start=1):
        if not isinstance(record, dict) or not {"prompt", "chosen", "rejected"} <= set(record):
            raise ConfigError(f'{path}, record {index}: expected {{"prompt": ..., "chosen": ..., "rejected": ...}}')
        chosen, rejected = str(record["chosen"]), str(record["rejected"])
        if chosen == rejected:
            raise ConfigError(f"{path}, record {index}: chosen and rejected are the same text")
        pairs.append(
            PreferencePair([sft_datum(codec, record["prompt"], chosen)], [sft_datum(codec, record["prompt"], rejected)])
        )
    return pairs


def pair_of_group(members: list[Trajectory]) -> PreferencePair | None:
    """The (best, worst) pair of one group by return; None when the returns are all equal."""
    best = max(members, key=lambda t: t.reward)
    worst = min(members, key=lambda t: t.reward)
    if best.reward == worst.reward:
        return None

    def datums(trajectory: Trajectory) -> list[Datum]:
        return [Datum.from_sequence(segment.input_ids, segment.loss_mask) for segment in trajectory.segments]

    return PreferencePair(datums(best), datums(worst))


async def pairs_from_store(path: str, options: ConvertOptions) -> list[PreferencePair]:
    """One pair per group of a store's converted trajectories: its best and its worst rollout."""
    async with SQLiteStore(path) as store:
        trajectories = [t async for t in convert_store(store, options=options)]
    pairs = (pair_of_group(members) for members in group_trajectories(trajectories).values())
    return [pair for pair in pairs if pair is not None]


def load_preference_pairs(data: str, tokenizer: object, options: ConvertOptions) -> list[PreferencePair]:
    """The pairs of `dpo.data` (a store or a JSONL file); ConfigError when there are none."""
    if not Path(data).is_file():
        raise ConfigError(f"dpo.data {data} does not exist; give a JSONL of preference pairs or a store (.sqlite)")
    if Path(data).suffix in STORE_SUFFIXES:
        pairs = asyncio.run(pairs_from_store(data, options))
    else:
        pairs = pairs_from_jsonl(data, tokenizer)
    if not pairs:
        raise ConfigError(f"dpo.data {data} gives no preference pair (a store needs groups with unequal returns)")
    return pairs


def step_datums(pairs: list[PreferencePair], references: dict[int, list[list[float]]]) -> list[Datum]:
    """The datums of one step's pairs, tagged with their pair and side and carrying their reference logprobs."""
    datums = []
    for index, pair in enumerate(pairs):
        sides = [(True, datum) for datum in pair.chosen] + [(False, datum) for datum in pair.rejected]
        for (chosen, datum), reference in zip(sides, references[id(pair)], strict=True):
            inputs = {**datum.loss_fn_inputs, DPO_REF_LOGPROBS: reference, DPO_PAIR: index, DPO_CHOSEN: chosen}
            datums.append(Datum(datum.model_input, inputs))
    return datums


def train_dpo(config: GRPOConfig, log: RunLog, *, resume: bool = False) -> RunSummary:
    """DPO on `config.dpo.data`: `config.steps` steps of `batch_size` pairs; `resume`: from the last checkpoint."""
    started = time.monotonic()
    run_dir = Path(config.run_dir)
    assert config.dpo.data is not None  # validated: mode = "dpo" needs it
    model_path = resolve_model_path(config.model)
    options = config.convert_options()
    pairs = load_preference_pairs(config.dpo.data, load_tokenizer(model_path), options)
    schedule = TaskSchedule(pairs, config.batch_size, config.seed)
    settings = StepSettings(dpo_loss(config.dpo.beta), None, adam_params(config))
    client = run_client(config, model_path)
    references: dict[int, list[list[float]]] = {}
    try:
        state = resume_latest(client, run_dir, config.seed, log, sync=False) if resume else None
        log.say(f"DPO on {len(pairs)} preference pairs from {config.dpo.data} (beta {config.dpo.beta})")
        for step in range(0 if state is None else int(state["next_step"]), config.steps):
            began = time.perf_counter()
            batch = schedule.for_step(step)
            unscored = [pair for key, pair in {id(p): p for p in batch}.items() if key not in references]
            if unscored:
                flat = [datum for pair in unscored for datum in pair.chosen + pair.rejected]
                scored = iter(client.reference_logprobs(flat))
                for pair in unscored:
                    references[id(pair)] = [next(scored).tolist() for _ in pair.chosen + pair.rejected]
            metrics = asyncio.run(train_step(client, step_datums(batch, references), settings))
            record = {
                "phase": "train",
                "step": step + 1,
                "mode": "dpo",
                "pairs": len(batch),
                **metrics,
                "time_step_s": round(time.perf_counter() - began, 4),
            }
            log.write(record)
            log.say(
                f"DPO step {step + 1}: loss {metrics['dpo_loss']:.4f} · accuracy {metrics['accuracy']:.2f} · "
                f"margin {metrics['margin']:+.4f}"
            )
            if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
                save_checkpoint(client, run_dir, step + 1, None, config.seed, log)
        client.save_weights_for_sampler(run_dir / "final_adapter")
    finally:
        client.close()
    return RunSummary(run_dir, config.steps, time.monotonic() - started, None, None)
