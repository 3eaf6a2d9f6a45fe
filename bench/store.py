"""Store ingest benchmark: prints ONE JSON line.

Concurrent writer tasks call `SQLiteStore.add_llm_call` one record at a time (the group-commit
path the span processor uses); each record carries three 64-long lists (prompt ids, response ids,
logprobs) plus a short message list. Each writer plays a stream of agent episodes: every
`--calls-per-attempt` calls it moves to a new (rollout, attempt) with ids made like the store makes
them (0 = one attempt per writer for the whole run, the worst case for index locality).

Reports records/s over the whole run and over the steady part (after the first 10k), process CPU
time per record, RSS after 10k and after all records and its growth, and the average batch
(records per transaction). Runs in a temporary directory that is removed afterwards.

--store postgresql: the same load on a PostgreSQL store (`PostgresStore`), on a throwaway server
started from the machine's binaries (`agl_bridge.testing.postgres`: fsync and synchronous_commit
on, as shipped) on the same cores, stopped afterwards; or --store postgresql://… to use a server
you run (its database must be empty or an agl_bridge store). With a throwaway server the CPU time
of the server's processes per record is reported too (`server_cpu_us_per_record`).

    .venv/bin/python bench/store.py [--records 100000] [--writers 64] [--calls-per-attempt 16]
                                    [--synchronous NORMAL] [--store sqlite|postgresql|URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agl_bridge.store import PostgresStore, SQLiteStore
from agl_bridge.store.batched import new_id
from agl_bridge.types import LLMCall

LIST_LENGTH = 64
CHECKPOINT = 10_000


def rss_mib() -> float:
    """Resident set size of this process now (Linux /proc), in MiB."""
    with open("/proc/self/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by process `pid` and its live children (Linux /proc)."""
    total = 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry) == pid or int(fields[1]) == pid:  # fields[1]: the parent's pid
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


async def run(
    records: int,
    writers: int,
    calls_per_attempt: int,
    synchronous: str,
    directory: str,
    dsn: str | None = None,
    server_pid: int | None = None,
) -> dict[str, object]:
    """Write `records` calls from `writers` tasks; return the measurements."""
    rng = random.Random(0)
    prompt = [rng.randrange(150_000) for _ in range(LIST_LENGTH)]
    response = [rng.randrange(150_000) for _ in range(LIST_LENGTH)]
    logprobs = [-rng.random() * 5 for _ in range(LIST_LENGTH)]
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    written = 0
    rss_at_checkpoint: float | None = None
    t_checkpoint = 0.0

    opened = SQLiteStore(Path(directory) / "bench.db", synchronous=synchronous) if dsn is None else PostgresStore(dsn)
    async with opened as store:

        async def writer(index: int) -> None:
            nonlocal written, rss_at_checkpoint, t_checkpoint
            rollout_id = new_id("ro")
            attempt_id = new_id("at")
            in_attempt = 0
            while written < records:
                written += 1
                if calls_per_attempt and in_attempt == calls_per_attempt:
                    rollout_id, attempt_id, in_attempt = new_id("ro"), new_id("at"), 0
                in_attempt += 1
                call = LLMCall(
                    rollout_id=rollout_id,
                    attempt_id=attempt_id,
                    model="bench",
                    prompt_token_ids=prompt,
                    response_token_ids=response,
                    response_logprobs=logprobs,
                    messages=messages,
                    response_text="4",
                    finish_reason="stop",
                )
                await store.add_llm_call(call)
                if rss_at_checkpoint is None and store.write_stats["ops"] >= CHECKPOINT:
                    rss_at_checkpoint = rss_mib()
                    t_checkpoint = time.perf_counter()

        t0 = time.perf_counter()
        cpu0 = time.process_time()
        server_cpu0 = tree_cpu_s(server_pid) if server_pid else 0.0
        await asyncio.gather(*(writer(i) for i in range(writers)))
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        server_cpu = tree_cpu_s(server_pid) - server_cpu0 if server_pid else None
        rss_end = rss_mib()
        stats = store.write_stats
    db_bytes = sum(f.stat().st_size for f in Path(directory).iterdir())
    steady = (stats["ops"] - CHECKPOINT) / (t0 + elapsed - t_checkpoint) if rss_at_checkpoint else None
    return {
        "bench": "store_ingest",
        "store": "sqlite" if dsn is None else "postgresql",
        "records": stats["ops"],
        "writers": writers,
        "calls_per_attempt": calls_per_attempt,
        "synchronous": synchronous if dsn is None else "synchronous_commit=on",
        "list_length": LIST_LENGTH,
        "records_per_s": round(stats["ops"] / elapsed),
        "records_per_s_after_10k": round(steady) if steady else None,
        # CPU time of the whole process (all threads) per record: steadier than wall-clock rates
        # on a shared machine.
        "cpu_us_per_record": round(1e6 * cpu / max(1, stats["ops"]), 1),
        "server_cpu_us_per_record": None if server_cpu is None else round(1e6 * server_cpu / max(1, stats["ops"]), 1),
        "avg_batch": round(stats["ops"] / max(1, stats["batches"]), 1),
        "rss_mib_at_10k": round(rss_at_checkpoint, 1) if rss_at_checkpoint else None,
        "rss_mib_at_end": round(rss_end, 1),
        "rss_growth_pct": round(100 * (rss_end - rss_at_checkpoint) / rss_at_checkpoint, 1)
        if rss_at_checkpoint
        else None,
        "db_mib": round(db_bytes / 2**20, 1) if dsn is None else None,
        "elapsed_s": round(elapsed, 2),
    }


def main() -> None:
    """Parse arguments, run the benchmark in a temporary directory, print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--writers", type=int, default=64)
    parser.add_argument("--calls-per-attempt", type=int, default=16)
    parser.add_argument("--synchronous", default="NORMAL", choices=["NORMAL", "FULL"])
    parser.add_argument("--store", default="sqlite", help="sqlite, postgresql (a throwaway server), or a URL")
    args = parser.parse_args()
    server = None
    dsn: str | None = None
    if args.store == "postgresql":
        from agl_bridge.testing.postgres import start_postgres

        server = start_postgres()
        dsn = server.dsn()
    elif args.store != "sqlite":
        dsn = args.store
    try:
        with tempfile.TemporaryDirectory(prefix="agl-store-bench-") as directory:
            result = asyncio.run(
                run(
                    args.records,
                    args.writers,
                    args.calls_per_attempt,
                    args.synchronous,
                    directory,
                    dsn,
                    server.pid if server else None,
                )
            )
    finally:
        if server is not None:
            server.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
