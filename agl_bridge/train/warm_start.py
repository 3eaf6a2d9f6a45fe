"""The supervised warm start (cold-start SFT) before RL: `cross_entropy` on (prompt, response) pairs.

Each of `warm_start.steps` steps trains on `warm_start.batch_size` examples drawn with the run's seed (a
pair each, or with `warm_start.merge_turns` a whole conversation of consecutive pairs), the loss averaged
over the batch's trained tokens; then the new weights go to the sampler, so the RL that follows starts
from them.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence
from typing import Any

from agl_bridge.chat import ChatCodec
from agl_bridge.convert.merge import prompt_extends
from agl_bridge.errors import ConfigError
from agl_bridge.primitives.client import AdamParams, TrainingClient
from agl_bridge.primitives.datum import Datum
from agl_bridge.runner import load_tasks
from agl_bridge.train.config import GRPOConfig
from agl_bridge.train.run_log import RunLog
from agl_bridge.train.step import StepSettings, train_step


def load_pairs(data: str | None) -> list[tuple[Any, str]]:
    """The (prompt, response) pairs of a JSONL file of {"prompt": ..., "response": str} records.

    A prompt is a string (one user message), a list of chat messages, or {"messages": [...], "tools": [...]}
    (an agent's request with its tool definitions); see `prompt_parts`.
    """
    if not data:
        return []
    pairs = []
    for index, record in enumerate(load_tasks(data), start=1):
        if not isinstance(record, dict) or "prompt" not in record or "response" not in record:
            raise ConfigError(f'{data}, record {index}: expected {{"prompt": ..., "response": ...}}')
        try:
            prompt_parts(record["prompt"])
        except ValueError as error:
            raise ConfigError(f"{data}, record {index}: {error}") from None
        pairs.append((record["prompt"], str(record["response"])))
    return pairs


def prompt_parts(prompt: Any) -> tuple[list[Any], list[Any] | None]:
    """(messages, tools) of a pair's prompt: a string is one user message; a list is the messages; a dict is
    {"messages": [...], "tools": [...]} (tools optional), as an agent's chat request carries them. ValueError
    for anything else."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}], None
    if isinstance(prompt, dict):
        unknown = sorted(set(prompt) - {"messages", "tools"})
        if unknown or not isinstance(prompt.get("messages"), list):
            raise ValueError(
                'a prompt object must be {"messages": [...], "tools": [...]} (tools optional)'
                + (f"; unknown keys {unknown}" if unknown else "")
            )
        tools = prompt.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise ValueError(f'a prompt\'s "tools" must be a list, got {type(tools).__name__}')
        return list(prompt["messages"]), None if tools is None else list(tools)
    if isinstance(prompt, (list, tuple)):
        return list(prompt), None
    raise ValueError(f"a prompt must be a string, a list of messages or an object, got {type(prompt).__name__}")


def sft_tokens(codec: ChatCodec, prompt: Any, response: str) -> tuple[list[int], list[int]]:
    """(tokens, weights) of one pair: the chat-templated prompt (weight 0), then the response and the end-of-turn
    token (weight 1).

    prompt: see `prompt_parts`; with tools, the template renders them as it does for the agent's requests.
    """
    messages, tools = prompt_parts(prompt)
    prompt_ids = codec.encode_prompt(messages, tools).token_ids
    response_ids = codec.tokenizer(response, add_special_tokens=False)["input_ids"] + [codec.stop_token_ids[0]]
    return prompt_ids + response_ids, [0] * len(prompt_ids) + [1] * len(response_ids)


def sft_datum(codec: ChatCodec, prompt: Any, response: str) -> Datum:
    """A cross_entropy datum of one pair (`sft_tokens`)."""
    return Datum.from_sequence(*sft_tokens(codec, prompt, response))


def merged_conversations(codec: ChatCodec, pairs: Sequence[tuple[Any, str]]) -> list[tuple[list[int], list[int]]]:
    """`warm_start.merge_turns`' examples, (tokens, weights) each: one per run of consecutive pairs whose every
    prompt continues the tokens before it (`convert.merge.prompt_extends`), the prompts' new tokens at weight
    0 and every response at weight 1."""
    examples: list[tuple[list[int], list[int]]] = []
    for prompt, response in pairs:
        tokens, weights = sft_tokens(codec, prompt, response)
        if examples:
            so_far, trained = examples[-1]
            if prompt_extends(array("i", tokens[: weights.index(1)]), array("i", so_far)):
                examples[-1] = (tokens, trained + weights[len(so_far) :])
                continue
        examples.append((tokens, weights))
    return examples


async def warm_start(
    client: TrainingClient, tokenizer: Any, pairs: Sequence[tuple[Any, str]], config: GRPOConfig, log: RunLog
) -> None:
    """Run the config's warm-start steps on `pairs`, then hand the new weights to the sampler."""
    warm = config.warm_start
    codec = ChatCodec(tokenizer)
    rng = random.Random(config.seed)
    settings = StepSettings(
        "cross_entropy", None, AdamParams(learning_rate=warm.learning_rate, grad_clip_norm=config.grad_clip_norm)
    )
    # Pairs are encoded as they are drawn (a large file costs nothing up front); merging needs them all first.
    conversations = merged_conversations(codec, pairs) if warm.merge_turns else None
    merged = f" ({len(pairs)} turns merged into {len(conversations)} conversations)" if conversations else ""
    log.say(f"supervised warm start: {warm.steps} steps × {warm.batch_size} examples (cross_entropy){merged}, then RL")
    for index in range(warm.steps):
        if conversations is None:
            drawn = [sft_tokens(codec, *rng.choice(pairs)) for _ in range(warm.batch_size)]
        else:
            drawn = [rng.choice(conversations) for _ in range(warm.batch_size)]
        datums = [Datum.from_sequence(tokens, weights) for tokens, weights in drawn]
        tokens = sum(sum(d.loss_fn_inputs["weights"]) for d in datums)
        for datum in datums:
            datum.loss_fn_inputs["weights"] = [w / tokens for w in datum.loss_fn_inputs["weights"]]
        metrics = await train_step(client, datums, settings)
        if (index + 1) % max(1, warm.steps // 5) == 0 or index + 1 == warm.steps:
            log.write(
                {
                    "phase": "warm_start",
                    "step": index + 1,
                    "loss": metrics.get("loss"),
                    "grad_norm": metrics.get("grad_norm"),
                }
            )
            log.say(f"warm start {index + 1}/{warm.steps}: loss {metrics.get('loss', float('nan')):.3f}")
    await client.save_weights_and_get_sampling_client_async()
