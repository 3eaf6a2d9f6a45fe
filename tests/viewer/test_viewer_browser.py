"""The viewer in a real browser (headless Chromium driven by Playwright) over a short real training run.

The run: the hello agent, GRPO on the tiny model, a short supervised warm start then 2 steps, with
a held-out evaluation (`agl-bridge train`, as a user runs it). The viewer runs as `agl-bridge view`.
Screenshots go to the test's tmp dir. Skipped, with the reason, where Chromium or Playwright is missing.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner
from viewer_helpers import call, start_viewer

from agl_bridge.cli import app
from agl_bridge.store import SQLiteStore

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture(scope="module")
def sync_playwright() -> Any:
    """Playwright's sync API, or a skip saying what is missing."""
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's chromium (apt-get install -y chromium)")
    module = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")
    return module.sync_playwright


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory, sync_playwright: Any) -> Path:
    """A finished 2-step GRPO run of the hello agent; the train command names the viewer command."""
    here = tmp_path_factory.mktemp("hello_run")
    (here / "tasks.jsonl").write_text("".join(f"{n}\n" for n in (3, 17, 42, 99, 7, 8)))
    (here / "eval.jsonl").write_text("5\n6\n")
    pairs = [{"prompt": f"Let's play a game. Say you are {n}.", "response": f"I'm {n}."} for n in range(100, 300)]
    (here / "warm.jsonl").write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    config = {
        "agent": f"{ROOT / 'examples' / 'hello_qwen' / 'agent.py'}:hello_agent",
        "tasks": str(here / "tasks.jsonl"),
        "eval_tasks": str(here / "eval.jsonl"),
        "run_dir": str(here / "run"),
        "steps": 2,
        "batch_size": 2,
        "group_size": 4,
        "learning_rate": 3e-3,
        "aggregation": "token_mean",
        "default_max_tokens": 16,
        "eval_every": 1,
        "checkpoint_every": 100,
        "tensorboard": False,
        "warm_start": {"data": str(here / "warm.jsonl"), "steps": 20, "batch_size": 16, "learning_rate": 2e-3},
    }
    (here / "run.json").write_text(json.dumps(config))
    command = [sys.executable, "-m", "agl_bridge.cli", "train", "--config", str(here / "run.json")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"agl-bridge view --run-dir {here / 'run'}" in result.stdout
    return here / "run"


@pytest.fixture(scope="module")
def viewer_url(trained_run: Path) -> Iterator[str]:
    """`agl-bridge view --run-dir RUN` on a free port; its printed address (with the key)."""
    process, url = start_viewer("--run-dir", str(trained_run))
    try:
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def browser(sync_playwright: Any) -> Iterator[Any]:
    """Headless Debian Chromium."""
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page; a console error or an outside request fails the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    opened = context.new_page()
    problems: list[str] = []
    opened.on("console", lambda message: message.type == "error" and problems.append(message.text))
    opened.on("request", lambda request: "127.0.0.1" not in request.url and problems.append(request.url))
    yield opened
    context.close()
    assert not problems, problems


def in_thread(work: Callable[[], Any]) -> Any:
    """Run `work` on its own thread and return its result (Playwright's sync API owns this thread's loop)."""
    results: list[Any] = []
    failures: list[BaseException] = []

    def run() -> None:
        try:
            results.append(work())
        except BaseException as error:  # handed back to the test
            failures.append(error)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(120)
    if failures:
        raise failures[0]
    return results[0]


def exported_trajectory(store: Path, rollout_id: str, out: Path) -> dict[str, Any]:
    """What `agl-bridge export --what trajectories` writes for one rollout."""
    command = ["export", "--store", str(store), "--what", "trajectories", "--rollout", rollout_id, "--out", str(out)]
    result = in_thread(lambda: CliRunner().invoke(app, command))
    assert result.exit_code == 0, result.output
    (line,) = out.read_text().splitlines()
    return json.loads(line)


def test_runs_page_then_a_rollout_and_the_tokens_it_trained(
    page: Any, viewer_url: str, trained_run: Path, tmp_path: Path
) -> None:
    page.goto(viewer_url)
    page.wait_for_selector(".chart svg path", state="attached")  # a flat line has no height: not "visible"
    assert page.locator(".chart").count() == 5
    assert page.locator('.chart[data-chart="reward"] .keys').inner_text().count("reward") == 2  # training, held-out
    chart = page.locator('.chart[data-chart="reward"] svg').bounding_box()
    page.mouse.move(chart["x"] + chart["width"] * 0.9, chart["y"] + chart["height"] / 2)
    assert "step 2" in page.locator("#tip").inner_text()  # hover shows the values
    page.mouse.move(chart["x"] + chart["width"] * 0.12, chart["y"] + 40)
    page.mouse.down()
    page.mouse.move(chart["x"] + chart["width"] * 0.6, chart["y"] + 40, steps=5)
    page.mouse.up()
    assert "showing steps 0–1" in page.locator(".zoomnote").inner_text()  # zoomed to a step range
    page.screenshot(path=str(tmp_path / "runs.png"), full_page=True)
    page.locator('.chart[data-chart="reward"] svg').dblclick()
    assert page.locator(".zoomnote").inner_text() == ""

    page.click('table.steps a[href="/steps/2"]')  # steps → groups → rollouts
    page.click("table.grid tbody tr:first-child td:first-child a")
    page.wait_for_selector("table.rollouts")
    page.screenshot(path=str(tmp_path / "group.png"), full_page=True)
    page.click("table.rollouts tbody tr:first-child a.rid")
    page.wait_for_selector("ol.timeline li.call")
    rollout_id = page.url.split("/rollouts/")[1].split("?")[0]
    assert page.locator("li.call .msg.r-user").first.inner_text().endswith(".")  # "Let's play a game. Say you are N."
    page.screenshot(path=str(tmp_path / "rollout.png"), full_page=True)

    page.click("text=Trained tokens")
    page.wait_for_selector(".tokens .tok")
    shown = page.eval_on_selector_all(
        ".tokens", "boxes => boxes.map(b => [...b.querySelectorAll('.tok')].map(t => [+t.dataset.id, +t.dataset.m]))"
    )
    exported = exported_trajectory(trained_run / "store.sqlite", rollout_id, tmp_path / "trajectory.jsonl")
    assert [[pair[0] for pair in s] for s in shown] == [s["input_ids"] for s in exported["segments"]]
    assert [[pair[1] for pair in s] for s in shown] == [s["loss_mask"] for s in exported["segments"]]
    trained = page.locator(".tokens .tok.m1").first
    trained.hover()
    tip = page.locator("#tip").inner_text()
    assert f"token id {trained.get_attribute('data-id')}" in tip
    assert "sampler logprob" in tip and "policy version" in tip
    page.select_option("select.colour-mode", "logprob")
    assert trained.evaluate("t => t.style.background").startswith("rgb")  # coloured by its logprob
    page.screenshot(path=str(tmp_path / "tokens.png"), full_page=True)


def test_new_calls_appear_without_a_reload(page: Any, viewer_url: str, trained_run: Path, tmp_path: Path) -> None:
    store = trained_run / "store.sqlite"
    base = viewer_url.split("/?")[0]
    page.goto(viewer_url)
    page.goto(base + "/rollouts")
    page.wait_for_selector("table.rollouts")
    attempt_ids: list[str] = []

    async def start() -> None:
        async with SQLiteStore(store) as opened:
            await opened.create_rollout(99, group_id="live-0", rollout_id="ro-live")
            attempt = (await opened.start_attempt("ro-live")).attempt_id
            attempt_ids.append(attempt)
            await opened.add_llm_call(call("ro-live", attempt, [1, 2], [3], response_text="first words"))

    in_thread(lambda: asyncio.run(start()))
    page.wait_for_selector('tr[data-rollout="ro-live"]', timeout=20_000)  # the list grew in place
    page.click('tr[data-rollout="ro-live"] a.rid')
    page.wait_for_selector("#call-0-0")
    marker = page.evaluate("() => (window.__same_page = true)")

    async def add() -> None:
        async with SQLiteStore(store) as opened:
            await opened.add_llm_call(call("ro-live", attempt_ids[0], [1, 2, 3, 4], [5], response_text="second words"))

    in_thread(lambda: asyncio.run(add()))
    page.wait_for_selector("#call-1-0", timeout=20_000)
    assert "second words" in page.locator("#call-1-0").inner_text()
    assert page.evaluate("() => window.__same_page") is marker  # no reload happened
    page.screenshot(path=str(tmp_path / "live.png"), full_page=True)
