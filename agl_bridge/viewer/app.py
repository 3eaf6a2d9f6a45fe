"""The viewer's web app: server-rendered pages over a store (read-only) and a run directory.

Pages: the run (curves from metrics.jsonl, its steps), a step (its groups), a group (its rollouts
with the trainer's advantages), every rollout (filter, sort, paginate), one rollout (its timeline,
or the tokens it trained), one call in full, and two attempts side by side. Each page marks the
parts that change while a run writes (`data-live`); the page's script re-fetches those parts with
`?fragment=1` when `/api/version` says the store or the metrics changed — no page reload.

Handlers are plain functions: Starlette runs them in its thread pool, each with its own read-only
connection and one read transaction per page.
"""

from __future__ import annotations

import datetime
import gc
import json
import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from markupsafe import escape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from agl_bridge.store.errors import StoreError
from agl_bridge.store.location import is_postgres_location
from agl_bridge.types import Attempt, AttemptStatus
from agl_bridge.viewer.access import KeyGate, cookie_name
from agl_bridge.viewer.chat import chat_message, response_message
from agl_bridge.viewer.db import ReadOnlyStore
from agl_bridge.viewer.listing import (
    PAGE_SIZE,
    RETURN_FUNCTION,
    STATUSES,
    FilterError,
    GroupSummary,
    RolloutQuery,
    groups,
    list_rollouts,
    return_aggregate,
    rollout_rows,
    same_task,
    store_counts,
)
from agl_bridge.viewer.pg_db import PostgresReadOnlyStore
from agl_bridge.viewer.records import get_call, record_counts
from agl_bridge.viewer.run_dir import MetricsLog, RunSettings, load_run_settings
from agl_bridge.viewer.steps import EVAL, TRAIN, step_of, train_group_range
from agl_bridge.viewer.timeline import timeline_page
from agl_bridge.viewer.tokens import TokenTexts
from agl_bridge.viewer.trained import (
    CALL_CLASSES,
    attempt_training,
    call_labels,
    group_key,
    train_group_ids,
    train_groups,
)

logger = logging.getLogger(__name__)

HERE = Path(__file__).parent
OUTSIDE = "outside"
"""The `attempt` value naming a rollout's records made outside any attempt."""

STEPS_PER_PAGE = 100


class Viewer:
    """What the pages read: the store (read-only), the run's settings and metrics, token text."""

    def __init__(self, store: str | Path, run_dir: Path | None = None, model: str | None = None) -> None:
        self.run_dir = run_dir
        self.settings: RunSettings = load_run_settings(run_dir)
        self.store: ReadOnlyStore | PostgresReadOnlyStore = (
            PostgresReadOnlyStore(store, options=self.settings.options)
            if is_postgres_location(store)
            else ReadOnlyStore(store, setup=self._setup)
        )
        self.metrics = MetricsLog(run_dir) if run_dir is not None else None
        self.texts = TokenTexts(model or self.settings.model)

    def settle(self) -> None:
        """Wait for the tokenizer to load, then hide what is loaded from the garbage collector (`gc.freeze`).

        A full collection would otherwise walk every object torch and transformers made (~0.5 s in
        the middle of a page, measured with the 100,000-call benchmark); frozen, it walks only what
        pages make. For a server process: it changes the whole process's collector.
        """
        self.texts.wait()
        gc.collect()
        gc.freeze()

    def _setup(self, conn: Any) -> None:
        conn.create_aggregate(RETURN_FUNCTION, 2, return_aggregate(self.settings.options))

    def version(self) -> dict[str, Any]:
        """What the live pages poll: changes whenever the store, metrics.jsonl or the token text status does."""
        return {
            "store": self.store.changes(),
            "metrics": self.metrics.version() if self.metrics else None,
            "token_text": self.texts.status,
        }

    def close(self) -> None:
        """Close the store connections."""
        self.store.close()


# --- template helpers ----------------------------------------------------------------------------


def fmt(value: Any, digits: int = 3) -> str:
    """A number for a table cell: '—' for none, floats to `digits` significant decimals."""
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.{digits}g}" if abs(value) >= 1e4 or (value and abs(value) < 1e-3) else f"{value:.{digits}f}"
    return f"{value:,}"


def when(timestamp: float | None) -> str:
    """Epoch seconds as local date and time."""
    if timestamp is None:
        return "—"
    return datetime.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def short_json(value: Any, limit: int = 120) -> str:
    """A task payload on one line, cut at `limit` characters."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def pretty_json(value: Any) -> str:
    """A payload as indented JSON."""
    return json.dumps(value, indent=2, ensure_ascii=False)


def link(path: str, params: Mapping[str, Any] | None = None, **extra: Any) -> str:
    """`path?params` with None values left out."""
    merged = {**(params or {}), **extra}
    query = urlencode({k: v for k, v in merged.items() if v is not None and v != ""})
    return f"{path}?{query}" if query else path


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(fmt=fmt, when=when, short_json=short_json, pretty_json=pretty_json)
    env.globals.update(link=link, step_of=step_of, STATUSES=STATUSES, TRAIN=TRAIN, EVAL=EVAL)
    return Jinja2Templates(env=env)


# --- the app -------------------------------------------------------------------------------------


def create_app(viewer: Viewer, *, key: str, port: int) -> KeyGate:
    """The ASGI app serving `viewer`, behind the key gate."""
    templates = _templates()

    def page(request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> Response:
        context = {"viewer": viewer, "request_path": request.url.path, **context}
        return templates.TemplateResponse(request, name, context, status_code=status_code)

    def fragment(request: Request) -> bool:
        return request.query_params.get("fragment") == "1"

    def runs(request: Request) -> Response:
        metrics = viewer.metrics
        train = metrics.train_records() if metrics else []
        evals = {r["step"]: r for r in (metrics.records() if metrics else []) if r.get("phase") == "eval"}
        page_number = _int_param(request, "page", 1)
        newest_first = list(reversed(train))
        shown = newest_first[(page_number - 1) * STEPS_PER_PAGE : page_number * STEPS_PER_PAGE]
        with viewer.store.snapshot() as conn:
            counts = store_counts(conn)
            store_steps = _store_steps(groups(conn)) if not train else {}
        context = {
            "steps": shown,
            "evals": evals,
            "steps_total": len(train),
            "steps_pages": max(1, -(-len(train) // STEPS_PER_PAGE)),
            "page": page_number,
            "counts": counts,
            "store_steps": store_steps,
            "has_metrics": bool(metrics and metrics.records()),
        }
        return page(request, "_runs_live.jinja" if fragment(request) else "runs.jinja", context)

    def step(request: Request) -> Response:
        number = request.path_params["step"]
        record = (
            next((r for r in viewer.metrics.train_records() if r["step"] == number), None) if viewer.metrics else None
        )
        eval_low, eval_high = f"eval{number}-", f"eval{number}."
        with viewer.store.snapshot() as conn:
            summaries = groups(conn, *train_group_range(number)) + groups(conn, eval_low, eval_high)
            if not summaries and record is None:
                raise HTTPException(404, f"step {number} is neither in metrics.jsonl nor in the store's groups")
            training = train_group_ids(conn, [s.group_id for s in summaries], viewer.settings)
        context = {"number": number, "record": record, "groups": summaries, "training": training}
        return page(request, "step.jinja", context)

    def group(request: Request) -> Response:
        group_id = request.path_params["group_id"]
        query = RolloutQuery(group=group_id, sort="created", descending=False)
        with viewer.store.snapshot() as conn:
            listed = list_rollouts(conn, query, viewer.settings.options, page_size=1000)
            if not listed.rows:
                raise HTTPException(404, f"no rollouts with group id {group_id!r} in {viewer.store.where}")
            training = train_group_ids(conn, [group_id], viewer.settings)[group_id]
        for row in listed.rows:
            final = row.final_attempt
            row.advantage = training.describe((row.rollout.rollout_id, final.attempt_id)) if final else ""
        context = {"group_id": group_id, "listing": listed, "training": training, "step": step_of(group_id)}
        return page(request, "_group_live.jinja" if fragment(request) else "group.jinja", context)

    def rollouts(request: Request) -> Response:
        try:
            query = RolloutQuery.from_params(request.query_params)
        except FilterError as exc:
            raise HTTPException(400, str(exc)) from None
        with viewer.store.snapshot() as conn:
            listed = list_rollouts(conn, query, viewer.settings.options)
            rows = listed.rows
            training = train_groups(conn, [r.rollout for r in rows], viewer.settings)
        for row in rows:
            final = row.final_attempt
            if final is not None:
                row.advantage = training[group_key(row.rollout)].describe((row.rollout.rollout_id, final.attempt_id))
        context = {"listing": listed, "query": query, "page_size": PAGE_SIZE}
        return page(request, "_rollouts_live.jinja" if fragment(request) else "rollouts.jinja", context)

    def rollout(request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        view = request.query_params.get("view", "timeline")
        if view not in ("timeline", "tokens"):
            raise HTTPException(400, f"view must be timeline or tokens, got {view!r}")
        after = _int_param(request, "after", -1, minimum=-1)
        full = request.query_params.get("full") == "1"
        with viewer.store.snapshot() as conn:
            ctx = _rollout_context(conn, viewer, rollout_id, request.query_params.get("attempt"), view, after, full)
        return page(request, "_rollout_live.jinja" if fragment(request) else "rollout.jinja", {"ctx": ctx})

    def call(request: Request) -> Response:
        rollout_id, sequence = request.path_params["rollout_id"], request.path_params["sequence"]
        attempt = request.query_params.get("attempt")
        choice = _int_param(request, "choice", 0, minimum=0)
        with viewer.store.snapshot() as conn:
            found = get_call(conn, rollout_id, None if attempt in (None, OUTSIDE) else attempt, sequence, choice)
        if found is None:
            where = f"attempt {attempt!r}" if attempt not in (None, OUTSIDE) else "no attempt (pass ?attempt=ID)"
            raise HTTPException(
                404, f"no call at sequence {sequence} (choice {choice}) of rollout {rollout_id!r}, {where}"
            )
        context = {
            "call": found,
            "messages": [chat_message(m) for m in found.messages],
            "response": response_message(found.response_text),
        }
        return page(request, "call.jinja", context)

    def compare(request: Request) -> Response:
        view = request.query_params.get("view", "timeline")
        sides = []
        with viewer.store.snapshot() as conn:
            for side in ("a", "b"):
                rollout_id = request.query_params.get(side)
                if not rollout_id:
                    raise HTTPException(400, f"compare needs two rollouts: ?a=ROLLOUT&b=ROLLOUT (missing {side!r})")
                attempt_id = request.query_params.get(f"{side}_attempt")
                sides.append(_rollout_context(conn, viewer, rollout_id, attempt_id, view, -1, False))
        return page(request, "compare.jinja", {"sides": sides, "view": view, "params": dict(request.query_params)})

    def api_version(request: Request) -> Response:
        return JSONResponse(viewer.version())

    def api_metrics(request: Request) -> Response:
        return JSONResponse({"charts": viewer.metrics.charts() if viewer.metrics else []})

    def error_page(request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException):
            status, message = exc.status_code, str(exc.detail)
        elif isinstance(exc, StoreError):
            status, message = 503, str(exc)
        else:
            logger.exception("viewer page %s failed", request.url.path, exc_info=exc)
            status, message = 500, f"the viewer failed on this page ({type(exc).__name__}); its log has the details"
        try:
            return page(request, "error.jinja", {"status": status, "message": message}, status_code=status)
        except Exception:  # the error page itself failed: plain text, never a stack trace
            return HTMLResponse(f"<h1>{status}</h1><p>{escape(message)}</p>", status_code=status)

    routes = [
        Route("/", runs),
        Route("/steps/{step:int}", step),
        Route("/groups/{group_id}", group),
        Route("/rollouts", rollouts),
        Route("/rollouts/{rollout_id}", rollout),
        Route("/rollouts/{rollout_id}/calls/{sequence:int}", call),
        Route("/compare", compare),
        Route("/api/version", api_version),
        Route("/api/metrics", api_metrics),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    handlers: dict[Any, Callable[..., Any]] = {HTTPException: error_page, StoreError: error_page, Exception: error_page}
    app = Starlette(routes=routes, exception_handlers=handlers)
    return KeyGate(app, key=key, cookie=cookie_name(port))


def _int_param(request: Request, name: str, default: int, *, minimum: int = 1) -> int:
    value = request.query_params.get(name)
    if value in (None, ""):
        return default
    try:
        number = int(value)
    except ValueError:
        raise HTTPException(400, f"{name} must be an integer, got {value!r}") from None
    if number < minimum:
        raise HTTPException(400, f"{name} must be >= {minimum}, got {number}")
    return number


def _store_steps(summaries: list[GroupSummary]) -> dict[int, dict[str, int]]:
    """Rollouts by status per training step, from the group ids (for runs without metrics)."""
    steps: dict[int, dict[str, int]] = {}
    for summary in summaries:
        ref = summary.step
        if ref is None or ref.kind != TRAIN:
            continue
        counts = steps.setdefault(ref.step, {"groups": 0})
        counts["groups"] += 1
        for status, n in summary.by_status.items():
            counts[status] = counts.get(status, 0) + n
    return dict(sorted(steps.items()))


def _rollout_context(
    conn: Any, viewer: Viewer, rollout_id: str, attempt_param: str | None, view: str, after: int, full: bool
) -> dict[str, Any]:
    """What the rollout page (and each side of a comparison) shows; 404 for an unknown rollout or attempt."""
    found = rollout_rows(conn, [rollout_id], viewer.settings.options)
    if not found:
        raise HTTPException(404, f"no rollout {rollout_id!r} in {viewer.store.where}")
    row = found[0]
    rollout, attempts = row.rollout, row.attempts
    has_outside = any(record_counts(conn, rollout_id, None))
    attempt: Attempt | None
    if attempt_param == OUTSIDE:
        attempt = None
    elif attempt_param:
        attempt = next((a for a in attempts if a.attempt_id == attempt_param), None)
        if attempt is None:
            raise HTTPException(404, f"rollout {rollout_id!r} has no attempt {attempt_param!r}")
    else:
        attempt = attempts[-1] if attempts else None
    group = train_groups(conn, [rollout], viewer.settings)[group_key(rollout)]
    attempt_id = attempt.attempt_id if attempt is not None else None
    if attempt is not None:
        row.advantage = group.describe((rollout_id, attempt.attempt_id))
    timeline = timeline_page(conn, rollout_id, attempt_id, after) if view == "timeline" else None
    labels = call_labels(group, rollout_id, attempt_id) if view == "timeline" else {}
    training = (
        attempt_training(group, attempt, viewer.texts, full=full) if view == "tokens" and attempt is not None else None
    )
    return {
        "rollout": rollout,
        "row": row,
        "attempts": attempts,
        "attempt": attempt,
        "attempt_param": attempt_id or OUTSIDE,
        "has_outside": has_outside,
        "step": step_of(rollout.group_id),
        "view": view,
        "timeline": timeline,
        "call_labels": labels,
        "call_classes": CALL_CLASSES,
        "counts": record_counts(conn, rollout_id, attempt_id),
        "same_task": same_task(conn, rollout),
        "training": training,
        "full": full,
        "after": after,
        "failed": attempt is not None and attempt.status in (AttemptStatus.FAILED, AttemptStatus.TIMED_OUT),
    }
