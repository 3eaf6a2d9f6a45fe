"""Converter benchmark: prints ONE JSON line.

Builds a synthetic store (in a child process, so its memory does not count) of `--rollouts`
rollouts × `--calls` LLM calls: turn t's prompt is the first turn's `--prompt` tokens plus every
earlier response (`--response` tokens) and observation (`--observation` tokens), so each attempt
merges into one segment, as a multi-turn agent's would; every rollout gets a reward after its
last call and every fourth a named "format" reward mid-way; one rollout in 50 fails. Messages are
stored too (growing turn by turn) so the store looks like a real one, though the converter does
not read them.

Then streams the store through `convert_store` (the trainer's path), discarding each trajectory,
and reports LLM calls converted per second of wall time and per CPU second, the resident set
size after 20% and 100% of the calls (flat when streaming), and the peak. By default the process
is pinned to one CPU (`--cpus 0`; the store's reader thread shares it), which is what the
≥ 50,000 calls/s target is about; `--cpus all` lets the reader thread run on another core.

    .venv/bin/python bench/convert.py [--rollouts 10000] [--calls 5] [--prompt 64] [--response 32]
                                      [--observation 16] [--cpus 0|all] [--store PATH]

`--store PATH` keeps the built store there (reused by later runs with the same path and sizes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agl_bridge.convert import ConversionReport, convert_store
from agl_bridge.store import SQLiteStore
from agl_bridge.types import AttemptStatus, LLMCall, Reward, RolloutStatus

TARGET_CALLS_PER_S = 50_000
GROUP_SIZE = 8
BATCH = 2_000


def rss_mib() -> float:
    """Resident set size of this process now (Linux /proc), in MiB."""
    with open("/proc/self/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (Linux reports KiB), in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def build(path: Path, rollouts: int, calls: int, prompt: int, response: int, observation: int) -> None:
    """Write the synthetic store described in the module doc."""
    rng = random.Random(0)
    base = [rng.randrange(1_000, 150_000) for _ in range(prompt)]
    responses = [[rng.randrange(1_000, 150_000) for _ in range(response)] for _ in range(calls)]
    observations = [[rng.randrange(1_000, 150_000) for _ in range(observation)] for _ in range(calls)]
    logprobs = [-rng.random() * 4 for _ in range(response)]
    async with SQLiteStore(path) as store:
        for start in range(0, rollouts, BATCH):
            ids = range(start, min(start + BATCH, rollouts))
            made = await asyncio.gather(
                *(
                    store.create_rollout({"question": f"task {i // GROUP_SIZE}"}, group_id=f"g-{i // GROUP_SIZE:06d}")
                    for i in ids
                )
            )
            attempts = await asyncio.gather(*(store.start_attempt(r.rollout_id) for r in made))
            records: list[LLMCall] = []
            rewards: list[Reward] = []
            for i, attempt in zip(ids, attempts, strict=False):
                tokens = [i % 1_000, *base[1:]]
                messages = [{"role": "user", "content": f"task {i // GROUP_SIZE}: " + "word " * prompt}]
                sequence = 0
                for turn in range(calls):
                    records.append(
                        LLMCall(
                            rollout_id=attempt.rollout_id,
                            attempt_id=attempt.attempt_id,
                            sequence=sequence,
                            model="tiny",
                            prompt_token_ids=tokens,
                            response_token_ids=responses[turn],
                            response_logprobs=logprobs,
                            token_policy_versions=[3] * response,
                            messages=messages,
                            response_text="reply " * response,
                            finish_reason="stop",
                        )
                    )
                    sequence += 1
                    if turn == calls // 2 and i % 4 == 0:
                        rewards.append(Reward(rollout_id=attempt.rollout_id, attempt_id=attempt.attempt_id,
                                              sequence=sequence, value=0.5, name="format"))  # fmt: skip
                        sequence += 1
                    tokens = tokens + responses[turn] + observations[turn]
                    messages = [*messages, {"role": "assistant", "content": "reply " * response},
                                {"role": "tool", "content": "result " * observation}]  # fmt: skip
                rewards.append(Reward(rollout_id=attempt.rollout_id, attempt_id=attempt.attempt_id,
                                      sequence=sequence, value=float(i % 2)))  # fmt: skip
            await store.add_llm_calls(records)
            await store.add_rewards(rewards)
            outcomes = [AttemptStatus.FAILED if i % 50 == 49 else AttemptStatus.SUCCEEDED for i in ids]
            await asyncio.gather(
                *(store.finish_attempt(a.attempt_id, o) for a, o in zip(attempts, outcomes, strict=False))
            )
            await asyncio.gather(
                *(
                    store.set_rollout_status(a.rollout_id, RolloutStatus(o.value))
                    for a, o in zip(attempts, outcomes, strict=False)
                )
            )


async def convert(path: Path, total_calls: int) -> dict[str, object]:
    """Stream the store through convert_store; return the measurements."""
    report = ConversionReport()
    trajectories = segments = 0
    rss_at_20: float | None = None
    async with SQLiteStore(path) as store:
        rss_start = rss_mib()
        wall, cpu = time.perf_counter(), time.process_time()
        async for trajectory in convert_store(store, report=report):
            trajectories += 1
            segments += len(trajectory.segments)
            if rss_at_20 is None and report.calls_seen >= total_calls // 5:
                rss_at_20 = rss_mib()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        rss_at_100 = rss_mib()
    return {
        "calls_converted": report.calls_seen,
        "calls_per_s": round(report.calls_seen / wall),
        "calls_per_cpu_s": round(report.calls_seen / cpu),
        "seconds": round(wall, 3),
        "cpu_seconds": round(cpu, 3),
        "trajectories": trajectories,
        "segments": segments,
        "attempts_dropped": report.dropped,
        "rss_mib_at_start": round(rss_start, 1),
        "rss_mib_at_20pct": round(rss_at_20 or rss_start, 1),
        "rss_mib_at_100pct": round(rss_at_100, 1),
        "peak_rss_mib": round(peak_rss_mib(), 1),
    }


def main() -> None:
    """Parse arguments, build (child process), convert, print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=5, help="LLM calls per rollout")
    parser.add_argument("--prompt", type=int, default=64, help="first prompt's tokens")
    parser.add_argument("--response", type=int, default=32, help="tokens per response")
    parser.add_argument("--observation", type=int, default=16, help="tokens added between turns")
    parser.add_argument("--cpus", default="0", help="CPU to pin to (e.g. 0), or 'all'")
    parser.add_argument("--store", type=Path, default=None, help="keep/reuse the built store here")
    parser.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = (args.rollouts, args.calls, args.prompt, args.response, args.observation)

    if args.build_only:
        asyncio.run(build(args.store, *sizes))
        return
    with tempfile.TemporaryDirectory(prefix="agl-bench-convert-") as scratch:
        path = args.store or Path(scratch) / "convert.db"
        stamp = path.with_suffix(path.suffix + ".sizes")
        build_s = 0.0
        if not (path.exists() and stamp.exists() and stamp.read_text() == json.dumps(sizes)):
            path.unlink(missing_ok=True)
            started = time.perf_counter()
            command = [sys.executable, __file__, "--build-only", "--store", str(path)]
            command += ["--rollouts", str(args.rollouts), "--calls", str(args.calls), "--prompt", str(args.prompt)]
            command += ["--response", str(args.response), "--observation", str(args.observation)]
            subprocess.run(command, check=True)
            build_s = time.perf_counter() - started
            stamp.write_text(json.dumps(sizes))
        if args.cpus != "all":
            os.sched_setaffinity(0, {int(args.cpus)})  # threads started later (the reader) inherit it
        measured = asyncio.run(convert(path, args.rollouts * args.calls))
    result = {
        "bench": "convert",
        "rollouts": args.rollouts,
        "calls_per_rollout": args.calls,
        "prompt_tokens": args.prompt,
        "response_tokens": args.response,
        "observation_tokens": args.observation,
        "cpus": sorted(os.sched_getaffinity(0)),
        **measured,
        "build_seconds": round(build_s, 1),
        "target_calls_per_s": TARGET_CALLS_PER_S,
        "meets_target": measured["calls_per_s"] >= TARGET_CALLS_PER_S,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
