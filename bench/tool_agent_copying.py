"""Does the shop agent's warm start teach the tiny model to copy the values it must write?

Runs `examples/langgraph_tool_agent/learn.py`'s warm start in-process, without the proxy: the same careless
teacher's episodes, the same `GRPOConfig` (learn.py's own `build_config`, so its defaults and flags: 3,000
episodes, each one example (`merge_turns`), 600 steps × 16 examples, lr 1e-3, every weight, seed 0) and the
same `agl_bridge.train.warm_start.warm_start`.
Before it and at every fifth of it, on the 40 held-out tasks (held-out (quantity, price) pairs, never
trained on), it prints:

- teacher-forced copy accuracy: on each task's careful episode (look up, order total, answer), whether the
  greedy tokens at the positions of each copied value are all right — the item in `lookup_price`, the
  quantity and the price in `order_total`, the total in the answer — and whether every other token of the
  three replies is ("format"; it includes the careful choices, look up and then order_total, which the careless
  teacher takes only half the time, so a greedy model may as well choose otherwise). Always writing the
  same value scores at most 9 (item), 10 (quantity), 6 (price) and 3 (answer) of the 40;
- greedy episodes: the real LangGraph agent played with the model answering greedily (the reply decoded
  and its tool calls parsed as the proxy does): success, episodes that called both tools, the endings.

    .venv/bin/python bench/tool_agent_copying.py                        # learn.py's defaults
    .venv/bin/python bench/tool_agent_copying.py --copy-pretrain        # from the model pre-trained to copy
    .venv/bin/python bench/tool_agent_copying.py --warm-start-steps 300 # any other learn.py flag too
    .venv/bin/python bench/tool_agent_copying.py --no-episodes          # copy accuracy only (~10 min at the defaults)
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "langgraph_tool_agent"
sys.path.insert(0, str(EXAMPLE))

COPIES = ("item", "quantity", "price", "answer")


def copy_accuracy(model: Any, codec: Any, tasks: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Per copied value (and "format": every other reply token), on how many tasks' careful episodes the
    greedy tokens at its positions are all right, the earlier turns teacher-forced."""
    import torch
    from shop.tasks import total
    from shop.teacher import teacher_episode

    tokenizer = codec.tokenizer
    right = dict.fromkeys((*COPIES, "format"), 0)
    for task in tasks:
        pairs, _ = teacher_episode(task, random.Random(0), 0.0, codec)
        turns = [
            [("item", task["item"])],
            [("quantity", task["quantity"]), ("price", task["prices"][task["item"]])],
            [("answer", total(task))],
        ]
        format_right = True
        for (prompt, response), values in zip(pairs, turns, strict=True):
            prompt_ids = codec.encode_prompt(prompt["messages"], prompt["tools"]).token_ids
            reply_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [codec.stop_token_ids[0]]
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([prompt_ids + reply_ids], device=model.device)).logits[0]
            greedy = logits[len(prompt_ids) - 1 : -1].argmax(-1).tolist()
            hits = [g == t for g, t in zip(greedy, reply_ids, strict=True)]
            copied: set[int] = set()
            after = 0
            for name, value in values:
                value_ids = tokenizer(str(value), add_special_tokens=False)["input_ids"]
                at = next(i for i in range(after, len(reply_ids)) if reply_ids[i : i + len(value_ids)] == value_ids)
                after = at + len(value_ids)
                span = range(at, after)
                copied.update(span)
                right[name] += all(hits[i] for i in span)
            format_right &= all(hit for i, hit in enumerate(hits) if i not in copied)
        right["format"] += format_right
    return right


class GreedyModel:
    """A `Player` answering the agent's requests with `model`'s greedy reply, decoded as the proxy decodes one."""

    def __init__(self, model: Any, codec: Any) -> None:
        from shop.agent import REPLY_MAX_TOKENS
        from shop.tools import tool_schemas

        self.model, self.codec = model, codec
        self.tools = tool_schemas()
        self.max_tokens = REPLY_MAX_TOKENS

    def reply(self, messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The model's greedy reply to `messages`, as an OpenAI assistant message."""
        import torch

        prompt = self.codec.encode_prompt(list(messages), self.tools).token_ids
        stop = list(self.codec.stop_token_ids)
        with torch.no_grad():
            out = self.model.generate(
                torch.tensor([prompt], device=self.model.device),
                max_new_tokens=self.max_tokens,
                do_sample=False,
                pad_token_id=0,
                eos_token_id=stop,
            )
        ids = out[0, len(prompt) :].tolist()
        stop_reason = "stop" if ids and ids[-1] in stop else "length"
        return self.codec.decode_response(ids, stop_reason).to_openai()


def greedy_episodes(model: Any, codec: Any, tasks: Sequence[dict[str, Any]]) -> tuple[float, float, Counter[str]]:
    """(success, share that called both tools, endings) of the real agent played greedily on `tasks`."""
    from shop.teacher import play_with

    outcomes = [play_with(GreedyModel(model, codec), task)[0] for task in tasks]
    both = sum({"lookup_price", "order_total"} <= set(o.tool_calls) for o in outcomes)
    return (
        sum(o.reward for o in outcomes) / len(tasks),
        both / len(tasks),
        Counter(o.reason for o in outcomes),
    )


class ReportingLog:
    """The warm start's log: every record it writes (each fifth of the steps) is followed by a report."""

    def __init__(self, report: Any) -> None:
        self.report = report

    def say(self, text: str) -> None:
        """Progress lines: printed."""
        print(text, flush=True)

    def write(self, record: dict[str, Any]) -> None:
        """A metrics record: its step is reported."""
        self.report(record["step"], record.get("loss"))


def main() -> None:
    """Build learn.py's warm-start data and config, warm-start, report along the way."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--no-episodes", action="store_true", help="copy accuracy only, no greedy episodes")
    own, rest = parser.parse_known_args()
    import learn

    args = learn.parse_args(rest)
    import torch

    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    from shop.tasks import held_out_tasks, phase_tasks
    from shop.teacher import warm_start_episodes

    from agl_bridge.chat import ChatCodec
    from agl_bridge.models.loading import load_tokenizer, resolve_model_path
    from agl_bridge.train.step import run_client
    from agl_bridge.train.warm_start import warm_start

    started = time.monotonic()
    if args.copy_pretrain:
        from agl_bridge.models.copying import pretrain_copying

        args.model = str(pretrain_copying(args.model))
    tokenizer = load_tokenizer(args.model)
    codec = ChatCodec(tokenizer)
    pairs, outcomes = warm_start_episodes(
        phase_tasks("warm_start", args.warm_start_episodes, args.seed), args.seed, args.shortcut_rate, tokenizer
    )
    print(
        f"warm-start data: {len(outcomes)} teacher episodes, {sum(o.reward > 0 for o in outcomes)} right, "
        f"{len(pairs)} model calls ({time.monotonic() - started:.0f} s)",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as run_dir:
        args.run_dir = run_dir
        config = learn.build_config(args)
        client = run_client(config, resolve_model_path(args.model))
        held_out = held_out_tasks()
        print(f"copy accuracy on the careful episodes of {len(held_out)} held-out tasks, teacher-forced greedy")
        print(f"{'step':>5} {'loss':>6} " + " ".join(f"{c:>8}" for c in (*COPIES, "format")) + "  greedy episodes")

        def report(step: int, loss: float | None) -> None:
            began = time.monotonic()
            right = copy_accuracy(client.model, codec, held_out)
            figures = " ".join(f"{right[c]:>5}/{len(held_out)}" for c in (*COPIES, "format"))
            episodes = ""
            if not own.no_episodes:
                success, both, endings = greedy_episodes(client.model, codec, held_out)
                ending = ", ".join(f"{reason} {n}" for reason, n in endings.most_common())
                episodes = f"  success {success:.3f}, both tools {both:.2f}; {ending}"
            loss_text = f"{loss:6.3f}" if loss is not None else " " * 6
            print(
                f"{step:>5} {loss_text} {figures}{episodes}  "
                f"(report {time.monotonic() - began:.0f} s, {time.monotonic() - started:.0f} s in all)",
                flush=True,
            )

        report(0, None)
        asyncio.run(warm_start(client, tokenizer, pairs, config, ReportingLog(report)))  # type: ignore[arg-type]
        client.close()
    print(f"wall time {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
