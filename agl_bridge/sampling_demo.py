"""A short end-to-end tour of the token layer: chat messages → exact ids → batched sampling → back.

Run by `agl-bridge demo --sampling-only`. It shows what the rest of agl_bridge relies on: concurrent
conversations share batched forward passes, every sampled token comes with its raw logprob and the
policy version that produced it, and a second turn's prompt extends the first turn's prompt +
response token for token, even where re-tokenizing the text would give other ids.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from agl_bridge.chat import ChatCodec, TokenCache
from agl_bridge.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
from agl_bridge.sampler.base import SamplingParams
from agl_bridge.sampler.hf import HFSampler


@dataclass
class TurnReport:
    """One conversation's first turn and whether its second prompt extended it exactly."""

    task: int
    reply: str
    tokens: int
    mean_logprob: float
    stop_reason: str
    reencode_differs: bool
    second_prompt_extends: bool


def run_sampling_demo(
    model: str = "tiny", conversations: int = 8, max_tokens: int = 24, seed: int = 0
) -> list[TurnReport]:
    """Run `conversations` two-turn chats concurrently through one sampler and print what happened."""
    console = Console()
    path = resolve_model_path(model)
    console.print(f"[bold]model[/bold] {model} → {path}")
    tokenizer = load_tokenizer(path)
    codec = ChatCodec(tokenizer)
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, stop=list(codec.stop_token_ids), seed=seed)

    def converse(task: int) -> TurnReport:
        cache = TokenCache(tokenizer)
        messages = [{"role": "user", "content": f"Let's play a game. Say you are {task}."}]
        first = codec.encode_prompt(messages, token_cache=cache)
        sequence = sampler.sample(first.token_ids, params).sequences[0]
        cache.remember(sequence.tokens, prompt_token_ids=first.token_ids)
        reply = codec.decode_response(sequence.tokens, sequence.stop_reason)
        messages += [reply.to_openai(), {"role": "user", "content": "Say it again."}]
        second = codec.encode_prompt(messages, token_cache=cache)
        expected = first.token_ids + sequence.tokens
        return TurnReport(
            task=task,
            reply=reply.content or "",
            tokens=len(sequence.tokens),
            mean_logprob=statistics.fmean(sequence.logprobs),
            stop_reason=sequence.stop_reason,
            reencode_differs=tokenizer.encode(tokenizer.decode(sequence.tokens), add_special_tokens=False)
            != sequence.tokens,
            second_prompt_extends=second.token_ids[: len(expected)] == expected,
        )

    with HFSampler(load_causal_lm(path), tokenizer, seed=seed) as sampler:
        started = time.perf_counter()
        with ThreadPoolExecutor(conversations) as pool:
            reports = list(pool.map(converse, range(1, conversations + 1)))
        elapsed = time.perf_counter() - started

    table = Table(title=f"{conversations} concurrent conversations, policy version {sampler.policy_version}")
    table.add_column("task")
    table.add_column("reply (random tiny model)", no_wrap=True, overflow="ellipsis", max_width=20)
    for column in ("tokens", "mean lp", "stop", "re-enc ≠ ids", "turn 2 extends"):
        table.add_column(column)
    for r in reports:
        table.add_row(
            str(r.task),
            repr(r.reply),
            str(r.tokens),
            f"{r.mean_logprob:.2f}",
            r.stop_reason,
            "yes" if r.reencode_differs else "no",
            "[green]exactly[/green]" if r.second_prompt_extends else "[red]NO[/red]",
        )
    console.print(table)
    total = sum(r.tokens for r in reports)
    console.print(
        f"{total} tokens sampled in {elapsed:.2f}s ({total / elapsed:.0f} tok/s, batched across conversations)"
    )
    console.print(
        "Every second prompt starts with the first prompt + the sampled ids, including where "
        "decoding and re-encoding the reply would give other ids."
    )
    return reports
