"""The ``agl-bridge`` command line: a thin layer over library functions, one command per job.

Commands translate user mistakes into one clear message and exit code 2 (typer.BadParameter);
the work itself lives in the library so it can be called and tested without the CLI.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer

from agl_bridge.models.tiny import InvalidTinySpecError, TinyModelSpec, build_tiny

app = typer.Typer(
    name="agl-bridge",
    help="Turn agent code into exact-token RL training data and train on it with GRPO.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def main() -> None:
    """Turn agent code into exact-token RL training data and train on it with GRPO."""
    # A callback keeps `agl-bridge <command>` a command group even while it has only one command.


@app.command("tiny-model")
def tiny_model(
    out_dir: Path = typer.Argument(
        ..., metavar="OUT_DIR", help="Directory to write into (created; must be empty or a previous tiny build)."
    ),
    hidden: int = typer.Option(TinyModelSpec.hidden, help="Hidden size; a multiple of 8 (head_dim = hidden/4)."),
    layers: int = typer.Option(TinyModelSpec.layers, help="Number of transformer layers (>= 1)."),
    vocab: int = typer.Option(TinyModelSpec.vocab, help="Tokenizer size, special and added tokens included."),
    seed: int = typer.Option(TinyModelSpec.seed, help="Seed of the random weights."),
    initializer_range: float = typer.Option(TinyModelSpec.initializer_range, help="Std of the random weights."),
) -> None:
    """Build the offline tiny test model (byte-level BPE tokenizer + random Qwen3) into OUT_DIR."""
    spec = TinyModelSpec(hidden=hidden, layers=layers, vocab=vocab, seed=seed, initializer_range=initializer_range)
    started = time.perf_counter()
    try:
        info = build_tiny(out_dir, spec)
    except InvalidTinySpecError as exc:
        raise typer.BadParameter(str(exc), param_hint=f"--{exc.field.replace('_', '-')}") from None
    except FileExistsError as exc:
        raise typer.BadParameter(str(exc), param_hint="OUT_DIR") from None
    elapsed = time.perf_counter() - started
    typer.echo(f"Wrote tiny model to {info.path.resolve()} in {elapsed:.1f}s")
    typer.echo(
        f"  vocab {info.vocab_size}, hidden {spec.hidden}, layers {spec.layers}, seed {spec.seed}: "
        f"{info.num_parameters:,} parameters, {info.bytes_on_disk / 1e6:.1f} MB on disk"
    )
    typer.echo(f"  eos <|im_end|> = {info.eos_token_id}, pad <|endoftext|> = {info.pad_token_id}")


@app.command("demo")
def demo(
    model: str = typer.Option("tiny", help="`tiny`, a local model directory, or a hub id."),
    conversations: int = typer.Option(8, min=1, max=64, help="Concurrent two-turn conversations."),
    max_tokens: int = typer.Option(24, min=1, help="Most tokens per reply."),
    seed: int = typer.Option(0, help="Sampling seed."),
) -> None:
    """Sample concurrent chats on the tiny model and show exact token ids, logprobs and turn extension."""
    from agl_bridge.models.loading import ModelNotFoundError
    from agl_bridge.sampling_demo import run_sampling_demo

    try:
        reports = run_sampling_demo(model, conversations=conversations, max_tokens=max_tokens, seed=seed)
    except ModelNotFoundError as exc:
        raise typer.BadParameter(str(exc), param_hint="--model") from None
    if not all(r.second_prompt_extends for r in reports):
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
