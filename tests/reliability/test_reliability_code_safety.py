"""Nothing that arrives over the network is unpickled or evaluated, and all SQL is parameterized.

Static checks over the package's source (the `ast` of every module), so a change that adds
`pickle.loads`, `eval`, an unsafe `yaml.load`, a `torch.load` without `weights_only=True`, or SQL
built from values fails here. SQL text may interpolate only identifiers and placeholder lists the
code itself builds; each such expression is listed below, and a new one must be reviewed and added.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "agl_bridge"

# Calls that run or deserialize arbitrary code/objects.
FORBIDDEN_CALLS = {
    "eval",
    "exec",
    "compile",
    "pickle.load",
    "pickle.loads",
    "cPickle.loads",
    "marshal.load",
    "marshal.loads",
    "shelve.open",
    "dill.loads",
    "dill.load",
    "jsonpickle.decode",
    "yaml.unsafe_load",
    "yaml.full_load",
    "numpy.load",
    "np.load",
}

_SQL = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|REPLACE|CREATE|DROP|ALTER|PRAGMA|WITH)\b|\b(FROM|WHERE|VALUES|SET)\b"
)

# Expressions interpolated into SQL text, by file: table/column names from module constants,
# "?" placeholder lists, and clauses made of those. Never a value.
SQL_INTERPOLATIONS: dict[str, set[str]] = {
    "store/sqlite_writer.py": {
        "table",
        "', '.join(columns)",
        "placeholders",
        "values",
        "max(1, int(self._max_db_bytes) // int(page_size))",
        "self._synchronous",
    },  # checked against SYNCHRONOUS_MODES in __init__
    "store/schema.py": {"VERSION_TABLE", "_ATTEMPTS_DDL"},
    # assignments: fixed column names; marks, listed: "?, ?, ..." placeholders, one per bound value
    "store/rollout_rules.py": {"ROLLOUT_SELECT", "ATTEMPT_SELECT", "assignments", "marks", "listed"},
    "store/batched.py": {"ROLLOUT_SELECT", "ATTEMPT_SELECT", "self._creation_order"},
    "store/postgres_schema.py": {"VERSION_TABLE", "_ID"},
    # The PostgreSQL writer: record tables and column lists from sqlite_rows, `%b` array placeholders.
    # ROLLOUT_LOCKS: the integer constant of the per-rollout advisory-lock space.
    "store/postgres_writer.py": {"table", "op.table", "', '.join(columns)", "arrays", "placeholders", "ROLLOUT_LOCKS"},
    "store/postgres.py": {
        "ROLLOUT_SELECT",
        "ATTEMPT_SELECT",
        "REWARD_SELECT",
        "_CALL_ORDER",
        "_RECORD_ORDER",
        "attributed",
        "call_select",
        "select",
        "table",
        "sql",
        "order",
        "CHANGE_CHANNEL",
    },
    "testing/postgres.py": {"name"},  # a database or schema name a test or benchmark chose
    "store/sqlite.py": {
        "ROLLOUT_SELECT",
        "ATTEMPT_SELECT",
        "marks",
        "', '.join(('?' for _ in values))",
        "select",
        "table",
        "order",
        "column",
        "', '.join(rest)",
        "', '.join(('?' for _ in rest))",
    },
    # The viewer (read-only): the store's column lists, IN-list markers, a WHERE of fixed conditions with `?`
    # values, and an ORDER BY picked from SORTS by name.
    "viewer/listing.py": {
        "RETURN_FUNCTION",
        "_FINAL_ATTEMPT",
        "SORTS[query.sort]",
        "direction",
        "column",
        "where",
        "marks(ids)",
    },
    "viewer/records.py": {
        "ATTEMPT_SELECT",
        "LLM_CALL_SELECT",
        "REWARD_SELECT",
        "ROLLOUT_SELECT",
        "marks(ids)",
        "marks(rollout_ids)",
        "order",
        "select",
        "table",
        "where",
    },
    "viewer/trained.py": {"marks(wanted)"},
}


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (str(path.relative_to(PACKAGE)), ast.parse(path.read_text(), str(path)))
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return ""


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


@pytest.mark.slow
def test_nothing_is_unpickled_or_evaluated() -> None:
    problems = []
    for module, tree in _modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = _name(node.func)
            where = f"{module}:{node.lineno}"
            if name in FORBIDDEN_CALLS:
                problems.append(f"{where}: {name}()")
            if name == "yaml.load":
                loader = _keyword(node, "Loader") or (node.args[1] if len(node.args) > 1 else None)
                if loader is None or not _name(loader).endswith(("SafeLoader", "CSafeLoader")):
                    problems.append(f"{where}: yaml.load without SafeLoader (use yaml.safe_load)")
            if name == "torch.load":
                safe = _keyword(node, "weights_only")
                if not (isinstance(safe, ast.Constant) and safe.value is True):
                    problems.append(f"{where}: torch.load without weights_only=True")
    assert problems == []


def test_the_scanner_catches_what_it_looks_for() -> None:
    """The checks above must be able to fail: run them on code that breaks each rule."""
    bad = ast.parse("import pickle, yaml, torch\npickle.loads(b)\neval(s)\nyaml.load(t)\ntorch.load(p)\n")
    names = {_name(n.func) for n in ast.walk(bad) if isinstance(n, ast.Call)}
    assert {"pickle.loads", "eval"} <= names & FORBIDDEN_CALLS
    sql = ast.parse("conn.execute(f\"SELECT * FROM t WHERE name = '{name}'\")")
    assert [ast.unparse(v.value) for v in ast.walk(sql) if isinstance(v, ast.FormattedValue)] == ["name"]


def _sql_text(node: ast.AST) -> str | None:
    """The literal text of an f-string, `%` or `.format` template, if it looks like SQL."""
    if isinstance(node, ast.JoinedStr):
        text = "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant):
        text = str(node.left.value)
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
        and isinstance(node.func.value, ast.Constant)
    ):
        text = str(node.func.value.value)
    else:
        return None
    # Upper-case keywords only: error messages in prose ("from", "where") are not SQL.
    return text if _SQL.search(text) and re.search(r"\b[A-Z]{3,}\b", text) else None


def test_sql_is_parameterized() -> None:
    problems = []
    for module, tree in _modules():
        allowed = SQL_INTERPOLATIONS.get(module, set())
        for node in ast.walk(tree):
            text = _sql_text(node)
            if text is None:
                continue
            where = f"{module}:{node.lineno}"
            if not isinstance(node, ast.JoinedStr):
                problems.append(f"{where}: SQL built with % or .format: {text[:80]!r}")
                continue
            for value in node.values:
                if isinstance(value, ast.FormattedValue) and ast.unparse(value.value) not in allowed:
                    problems.append(f"{where}: SQL interpolates {ast.unparse(value.value)!r} into {text[:60]!r}")
    assert problems == [], "bind values with ? placeholders; identifiers built in code go in SQL_INTERPOLATIONS"


HOSTILE = [
    "x'); DROP TABLE llm_calls; --",
    'a" OR "1"="1',
    "%s %d {0} ?",
    "\x00nul",
    "ro' UNION SELECT * FROM rewards --",
]


async def test_hostile_values_are_stored_as_data(tmp_path: Path) -> None:
    """Values that would break SQL built by string formatting round-trip as plain data."""
    from agl_bridge.store import SQLiteStore
    from agl_bridge.types import LLMCall, Reward

    async with SQLiteStore(tmp_path / "s.sqlite") as store:
        for index, text in enumerate(HOSTILE):
            rollout = await store.create_rollout({"task": text}, group_id=f"g-{index}")
            attempt = await store.start_attempt(rollout.rollout_id)
            await store.add_llm_call(
                LLMCall(
                    rollout_id=rollout.rollout_id,
                    attempt_id=attempt.attempt_id,
                    model=text,
                    prompt_token_ids=[1],
                    response_token_ids=[2],
                    response_logprobs=[-0.5],
                    messages=[{"role": "user", "content": text}],
                    response_text=text,
                )
            )
            await store.add_reward(
                Reward(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, name=text, value=1.0)
            )
            calls = [c async for c in store.iter_llm_calls(rollout.rollout_id)]
            rewards = [r async for r in store.iter_rewards(rollout.rollout_id)]
            assert [c.model for c in calls] == [text] and calls[0].response_text == text
            assert [r.name for r in rewards] == [text]
            assert (await store.get_rollout(rollout.rollout_id)).task == {"task": text}
        assert len(await store.list_rollouts()) == len(HOSTILE)
