"""The PostgreSQL store's own promises: several processes writing at once, its faults and its messages.

What every backend does is in test_store_contract.py and the other store tests (run on both
backends); here: sequence allocation across processes, an unreachable or restarted server, a wrong
DSN, a schema of another version, and the converter's whole-store walk matching SQLite's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest
from shared_helpers import REPO, collect, free_port

from agl_bridge.store import (
    SCHEMA_VERSION,
    PostgresStore,
    SQLiteStore,
    StoreSchemaError,
    StoreUnavailableError,
    store_at,
)
from agl_bridge.testing.postgres import PostgresUnavailable, start_postgres
from agl_bridge.types import AttemptStatus, CallClass, LLMCall, Reward, RolloutOrigin


def call(rollout_id: str, attempt_id: str, n: int = 0) -> LLMCall:
    return LLMCall(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        model="tiny",
        prompt_token_ids=[1, 2, n],
        response_token_ids=[3, n],
        response_logprobs=[-0.5, -1e-300],
        token_policy_versions=[0, 0],
    )


_WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from agl_bridge.store import PostgresStore
    from agl_bridge.types import LLMCall

    async def main(dsn, me, count):
        async with PostgresStore(dsn) as store:
            async def one(n):
                if n % 4 == 3:  # attempts of one rollout, new to the store, registered by every process at once
                    key = ("multi", f"{me}-{n % 3}")
                else:
                    key = ("shared", "0") if n % 2 == 0 else (f"own-{me}-{n % 5}", "0")
                call = LLMCall(rollout_id=key[0], attempt_id=key[1], model="m", prompt_token_ids=[n],
                               response_token_ids=[me], response_logprobs=[-1.0], token_policy_versions=[0])
                return await store.add_llm_call(call)
            await asyncio.gather(*(one(n) for n in range(count)))

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
    """
)


async def test_processes_writing_at_once_get_gap_free_unique_sequences(postgres_dsn: str) -> None:
    processes, per_process = 3, 160
    writers = [
        subprocess.Popen([sys.executable, "-c", _WRITER, postgres_dsn, str(me), str(per_process)], cwd=REPO)
        for me in range(processes)
    ]
    for writer in writers:
        assert await asyncio.to_thread(writer.wait, 120) == 0
    async with PostgresStore(postgres_dsn) as store:
        shared = [c.sequence async for c in store.iter_llm_calls("shared", "0")]
        assert shared == list(range(processes * per_process // 2)), "gaps or duplicates across processes"
        for me in range(processes):
            for k in range(5):
                own = [c.sequence async for c in store.iter_llm_calls(f"own-{me}-{k}", "0")]
                assert own == list(range(len(own))) and own
        rollout = await store.get_rollout("shared")
        assert rollout is not None and rollout.origin is RolloutOrigin.EXTERNAL and rollout.attempts == 1
        assert [a.number for a in await store.list_attempts("shared")] == [1]  # registered once, by one process
        multi = await store.list_attempts("multi")
        assert sorted(a.number for a in multi) == list(range(1, 3 * processes + 1)), "each attempt one number"
        assert (await store.get_rollout("multi")).attempts == 3 * processes  # type: ignore[union-attr]
        assert len(await store.list_rollouts()) == 2 + processes * 5


async def test_a_wrong_dsn_is_one_line_naming_host_port_and_database_never_the_password() -> None:
    port = free_port()
    store = PostgresStore(f"postgresql://alice:s3cret-pw@127.0.0.1:{port}/agl_runs", connect_timeout_s=2)
    with pytest.raises(StoreUnavailableError) as caught:
        await store.open()
    message = str(caught.value)
    assert f"postgresql://127.0.0.1:{port}/agl_runs as alice" in message and "unreachable" in message
    assert "s3cret" not in message and "\n" not in message


async def test_a_database_that_does_not_exist_is_named(postgres_server) -> None:  # type: ignore[no-untyped-def]
    dsn = postgres_server.dsn("no_such_db").replace("postgres@", "postgres:pw-xyz@")
    with pytest.raises(StoreUnavailableError) as caught:
        await PostgresStore(dsn).open()
    message = str(caught.value)
    assert "no_such_db" in message and "does not exist" in message and "pw-xyz" not in message


async def test_another_schema_version_or_foreign_tables_are_refused(postgres_dsn: str, postgres_server) -> None:  # type: ignore[no-untyped-def]
    async with PostgresStore(postgres_dsn):
        pass
    schema = postgres_dsn.rsplit("%3D", 1)[1]
    with psycopg.connect(postgres_server.dsn(), autocommit=True) as conn:
        conn.execute(f'UPDATE "{schema}".agl_schema_version SET version = 99, created_by = %s', ("agl_bridge 9.0",))
    expected = f"schema version 99 but this agl_bridge expects version {SCHEMA_VERSION}.*newer"
    with pytest.raises(StoreSchemaError, match=expected):
        await PostgresStore(postgres_dsn).open()
    foreign = postgres_server.create_schema("foreign_app")
    with psycopg.connect(foreign, autocommit=True) as conn:
        conn.execute("CREATE TABLE invoices (id int)")
    with pytest.raises(StoreSchemaError, match=r"holds tables \(invoices\) but no agl_bridge store"):
        await PostgresStore(foreign).open()


async def test_a_version_2_store_is_upgraded_in_place_keeping_its_calls(postgres_dsn: str, postgres_server) -> None:  # type: ignore[no-untyped-def]
    async with PostgresStore(postgres_dsn) as store:
        await store.add_llm_call(call("ro", "0", 1))
    schema = postgres_dsn.rsplit("%3D", 1)[1]
    with psycopg.connect(postgres_server.dsn(), autocommit=True) as conn:  # back to version 2's layout
        dropped = "DROP COLUMN declared_class, DROP COLUMN declared_parent, DROP COLUMN carries"
        conn.execute(f'ALTER TABLE "{schema}".llm_calls {dropped}')
        conn.execute(f'UPDATE "{schema}".agl_schema_version SET version = 2')
    async with PostgresStore(postgres_dsn) as store:
        (kept,) = [c async for c in store.iter_llm_calls("ro", "0")]
        assert (kept.prompt_token_ids, kept.declared_class, kept.declared_parent) == ([1, 2, 1], None, None)
        upgraded = dataclasses.replace(call("ro", "0", 2), declared_class=CallClass.RETRY, declared_parent="0")
        await store.add_llm_call(upgraded)
        assert [(c.declared_class, c.declared_parent) async for c in store.iter_llm_calls("ro", "0")] == [
            (None, None),
            (CallClass.RETRY, "0"),
        ]
    with psycopg.connect(postgres_server.dsn(), autocommit=True) as conn:
        version, created_by = conn.execute(f'SELECT version, created_by FROM "{schema}".agl_schema_version').fetchone()
    assert version == SCHEMA_VERSION == 3 and "upgraded to 3" in created_by


async def test_the_converter_walk_matches_sqlite_record_for_record(postgres_dsn: str, tmp_path: Path) -> None:
    async def fill(store: SQLiteStore | PostgresStore) -> None:
        for r in range(7):
            rollout = await store.create_rollout({"r": r}, group_id=f"g{r % 2}", rollout_id=f"ro-{r}")
            for _ in range(2):
                attempt = await store.start_attempt(rollout.rollout_id)
                for n in range(r):
                    await store.add_llm_call(call(rollout.rollout_id, attempt.attempt_id, n))
                await store.add_reward(Reward(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, value=r))
                await store.finish_attempt(attempt.attempt_id, AttemptStatus.SUCCEEDED)
        await store.add_llm_call(call("external", "0"))  # registered on its first record

    def strip(records: list) -> list:  # type: ignore[type-arg]
        # ids and times differ between the two stores; everything else must not
        out = []
        for rollout in records:
            attempts = [
                (
                    a.attempt.number,
                    [(c.sequence, list(c.prompt_token_ids), list(c.response_logprobs)) for c in a.calls],
                    [(w.sequence, w.value) for w in a.rewards],
                )
                for a in rollout.attempts
            ]
            out.append((rollout.rollout.rollout_id, rollout.rollout.task, attempts))
        return out

    async with SQLiteStore(tmp_path / "s.db") as lite, PostgresStore(postgres_dsn, read_page_size=3) as pg:
        await fill(lite)
        await fill(pg)
        for tokens_only in (False, True):
            expected = strip(await collect(lite.iter_rollout_records(tokens_only=tokens_only)))
            assert strip(await collect(pg.iter_rollout_records(tokens_only=tokens_only))) == expected
        assert len(expected) == 8
        assert [c.sequence async for c in pg.iter_all_calls()] == [c.sequence async for c in lite.iter_all_calls()]


async def test_a_restarted_server_answers_unavailable_then_the_store_recovers() -> None:
    try:
        server = start_postgres()
    except PostgresUnavailable as exc:
        pytest.skip(f"no PostgreSQL server can run here: {exc}")
    try:
        async with store_at(server.dsn()) as store:
            acknowledged = [await store.add_llm_call(call("r", "0", n)) for n in range(3)]
            server.stop(keep_files=True)
            with pytest.raises(StoreUnavailableError, match="unreachable"):
                await store.add_llm_call(call("r", "0", 99))
            with pytest.raises(StoreUnavailableError):
                await store.get_rollout("r")
            server.start()
            acknowledged.append(await store.add_llm_call(call("r", "0", 4)))  # no call needed to notice
            assert (await store.get_rollout("r")) is not None
            stored = [(c.sequence, c.prompt_token_ids[2]) async for c in store.iter_llm_calls("r", "0")]
        assert acknowledged == [0, 1, 2, 3]
        assert stored == [(0, 0), (1, 1), (2, 2), (3, 4)]  # every acknowledged call, and no gap
    finally:
        server.stop()


async def test_a_sampled_nul_round_trips_and_other_text_keeps_its_place(postgres_dsn: str) -> None:
    # PostgreSQL text cannot hold NUL; models sample it (the tiny model does).
    async with PostgresStore(postgres_dsn) as store:
        sampled = dataclasses.replace(call("r", "0"), response_text="a\x00b\udcff")
        await store.add_llm_call(sampled)
        attempt = await store.get_attempt("0", "r")
        assert attempt is not None
        await store.finish_attempt("0", AttemptStatus.FAILED, error="bad\x00byte", rollout_id="r")
        (stored,) = await collect(store.iter_llm_calls("r", "0"))
        (walked,) = await collect(store.iter_rollout_records())
        assert stored.response_text == walked.attempts[0].calls[0].response_text == "a\x00b\udcff"
        assert (await store.get_attempt("0", "r")).error == "bad\ufffdbyte"  # type: ignore[union-attr]
