"""Can the tiny model learn the Twenty Questions warm start well enough to play held-out entities?

Trains the model on the scripted player's games (`examples/crewai_twenty_questions/twenty_q/scripted.py`)
with plain torch (cross-entropy on the replies, 16 examples a step), and every `--report-every` steps plays
40 games each of warm-start, RL and held-out entities against the bundled answerer (sampling at
temperature 1, the flow's messages without CrewAI's per-turn cost). Prints one line per report: the loss,
and per phase (success rate, share of replies that name a listed candidate, turns used).

    .venv/bin/python bench/twenty_questions_warm_start.py                       # the tiny model, full weights
    .venv/bin/python bench/twenty_questions_warm_start.py --made-up-names 0.5   # half the names made up
    .venv/bin/python bench/twenty_questions_warm_start.py --copy-pretrain       # pre-trained to copy first
    .venv/bin/python bench/twenty_questions_warm_start.py --lora 32             # a LoRA instead
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "crewai_twenty_questions"))

from twenty_q.env import apply_offline_environment  # noqa: E402

apply_offline_environment()


def main() -> None:
    """Train and report."""
    import torch
    from twenty_q.answerer import DeterministicAnswerer
    from twenty_q.learning import MAX_TURNS, phase_tasks, with_made_up_names
    from twenty_q.prompts import extract_question, feedback_message, opening_message
    from twenty_q.scripted import crewai_system_prompt, warm_start_games

    from agl_bridge.chat import ChatCodec
    from agl_bridge.models.copying import pretrain_copying
    from agl_bridge.models.loading import load_causal_lm, load_tokenizer, resolve_model_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--report-every", type=int, default=100)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--question-rate", type=float, default=0.0)
    parser.add_argument("--made-up-names", type=float, default=0.0, help="share of warm-start names made up")
    parser.add_argument("--copy-pretrain", action="store_true", help="start from the model pre-trained to copy")
    parser.add_argument("--lora", type=int, default=0, help="train a LoRA of this rank instead of every weight")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    path = str(pretrain_copying(args.model)) if args.copy_pretrain else resolve_model_path(args.model)
    tokenizer = load_tokenizer(path)
    model = load_causal_lm(path)
    codec = ChatCodec(tokenizer)
    if args.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=args.lora, lora_alpha=2 * args.lora, target_modules="all-linear"))
    tasks, table = with_made_up_names(phase_tasks("warm_start", 4), args.made_up_names, random.Random(0))
    pairs, _ = warm_start_games(tasks, 0, args.question_rate, MAX_TURNS, table)
    system = crewai_system_prompt()
    answerer = DeterministicAnswerer()
    stop = codec.stop_token_ids

    def encode(messages: list[dict], reply: str) -> tuple[list[int], list[int]]:
        prompt = codec.encode_prompt(messages).token_ids
        return prompt, tokenizer(reply, add_special_tokens=False)["input_ids"] + [stop[0]]

    data = [encode(m, r) for m, r in pairs]

    def play(games: list[dict]) -> tuple[float, float, float]:
        model.eval()
        wins = turns = named = replies = 0
        with torch.no_grad():
            for task in games:
                messages = [
                    system,
                    {"role": "user", "content": opening_message(task["category"], MAX_TURNS, task["candidates"])},
                ]
                for turn in range(1, MAX_TURNS + 1):
                    prompt = codec.encode_prompt(messages).token_ids
                    out = model.generate(
                        torch.tensor([prompt]),
                        max_new_tokens=16,
                        do_sample=True,
                        temperature=1.0,
                        pad_token_id=0,
                        eos_token_id=stop,
                    )
                    reply = tokenizer.decode(out[0, len(prompt) :], skip_special_tokens=True).strip()
                    replies += 1
                    question = extract_question(reply, task["candidates"])
                    named += question in {f"Is it {name}?" for name in task["candidates"]}
                    answer = answerer.answer(task["secret"], question) if question else None
                    messages += [
                        {"role": "assistant", "content": reply},
                        {
                            "role": "user",
                            "content": feedback_message(
                                turn, MAX_TURNS, question, answer.yes_or_no if answer else None
                            ),
                        },
                    ]
                    if answer is not None and answer.correct:
                        wins += 1
                        break
                turns += turn
        model.train()
        return wins / len(games), named / replies, turns / len(games)

    phases = {
        "warm": phase_tasks("warm_start", 1, 5)[:40],
        "rl": phase_tasks("rl", 1)[:40],
        "held_out": phase_tasks("held_out", 1),
    }
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate)
    rng = random.Random(0)
    started = time.monotonic()
    for step in range(1, args.steps + 1):
        batch = [rng.choice(data) for _ in range(args.batch_size)]
        width = max(len(p) + len(r) for p, r in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        labels = torch.full((len(batch), width), -100)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for row, (prompt, reply) in enumerate(batch):
            sequence = prompt + reply
            ids[row, : len(sequence)] = torch.tensor(sequence)
            mask[row, : len(sequence)] = 1
            labels[row, len(prompt) : len(sequence)] = torch.tensor(reply)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % args.report_every == 0:
            figures = {name: tuple(round(x, 3) for x in play(games)) for name, games in phases.items()}
            print(
                f"step {step} loss {loss.item():.3f} ({time.monotonic() - started:.0f}s) "
                f"(success, named a candidate, turns): {figures}",
                flush=True,
            )


if __name__ == "__main__":
    main()
