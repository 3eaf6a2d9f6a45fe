"""A proxy for the reliability tests and benchmarks, run as a subprocess: `python -m agl_bridge.testing.serve ...`.

`--sampler instant` answers at once (the pure-overhead case); `--sampler slow` streams `--tokens`
tokens one every `--token-delay` seconds, so a test can kill the process while a stream is open;
`--sampler tiny` is the tiny model on the HF sampler. Prints `READY <port>` once it answers, and
dies with its parent (Linux), so a crashed test run leaves nothing behind.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator, Sequence
from typing import Any

from agl_bridge.sampler.base import SampleResult, SamplingParams, TokenEvent
from agl_bridge.sampler.instant import InstantSampler


class SlowSampler(InstantSampler):
    """An InstantSampler whose stream yields one token every `delay` seconds."""

    def __init__(self, response_tokens: Sequence[int], *, vocab_size: int, delay: float) -> None:
        super().__init__(response_tokens, vocab_size=vocab_size)
        self.delay = delay

    async def sample_async(
        self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int = 1
    ) -> SampleResult:
        """The fixed response after `delay` per token."""
        result = self.sample(prompt_tokens, params, num_samples)
        await asyncio.sleep(self.delay * len(result.sequences[0].tokens))
        return result

    async def sample_stream(
        self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int = 1
    ) -> AsyncIterator[TokenEvent | SampleResult]:
        """Token events one `delay` apart, then the result."""
        result = self.sample(prompt_tokens, params, num_samples)
        for position in range(len(result.sequences[0].tokens)):
            await asyncio.sleep(self.delay)
            for index, sequence in enumerate(result.sequences):
                yield TokenEvent(index, sequence.tokens[position], sequence.logprobs[position], 0)
        yield result


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _sampler(kind: str, model_dir: str, tokenizer: Any, tokens: int, delay: float) -> Any:
    from agl_bridge.chat import ChatCodec

    if kind == "tiny":
        from agl_bridge.models.loading import load_causal_lm
        from agl_bridge.sampler.hf import HFSampler

        return HFSampler(load_causal_lm(model_dir), tokenizer, seed=0)
    word = tokenizer("ok", add_special_tokens=False)["input_ids"]
    ids = (word * tokens)[: max(1, tokens - 1)] + [ChatCodec(tokenizer).stop_token_ids[0]]
    if kind == "slow":
        return SlowSampler(ids, vocab_size=len(tokenizer), delay=delay)
    return InstantSampler(ids, vocab_size=len(tokenizer))


def main() -> None:
    """Parse the arguments and serve until killed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--sampler", choices=["instant", "slow", "tiny"], default="instant")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--token-delay", type=float, default=0.0)
    parser.add_argument("--key", default="sk-reliability")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-request-bytes", type=int, default=None, help="the body limit (default: the server's)")
    args = parser.parse_args()
    _die_with_parent()
    from agl_bridge.models.loading import load_tokenizer
    from agl_bridge.proxy.server import ProxyServer

    tokenizer = load_tokenizer(args.model_dir)
    sampler = _sampler(args.sampler, args.model_dir, tokenizer, args.tokens, args.token_delay)
    server = ProxyServer(
        sampler=sampler,
        tokenizer=tokenizer,
        store_path=args.store,
        model_name="tiny",
        port=args.port,
        api_key=args.key,
        default_max_tokens=64,
        max_request_bytes=args.max_request_bytes,
    )
    signal.signal(signal.SIGTERM, lambda *_: None)  # uvicorn handles the first SIGTERM itself
    try:
        server.serve_forever(on_ready=lambda ready: print(f"READY {ready.port}", flush=True))
    except KeyboardInterrupt:
        pass
    finally:
        if hasattr(sampler, "close"):
            sampler.close()


if __name__ == "__main__":
    main()
