"""The viewer's pages over the scenario store: what each shows, filters and sorting, the token view, bad input."""

from __future__ import annotations

import asyncio
import html
import re
from pathlib import Path

from starlette.testclient import TestClient
from viewer_helpers import KEY, token_segments

from agl_bridge.convert import ConversionReport, DropReason, SplitKind, convert_store
from agl_bridge.store import SQLiteStore
from agl_bridge.train.advantages import group_advantages
from agl_bridge.viewer.app import Viewer, create_app


def rollout_ids(html: str) -> list[str]:
    """The rollouts a list page shows, in order."""
    return re.findall(r'<tr data-rollout="([^"]+)"', html)


def converted(store: Path) -> dict[str, object]:
    """The converter's trajectories of the store by rollout id (the trainer's view of it)."""

    async def run() -> dict[str, object]:
        async with SQLiteStore(store) as opened:
            return {t.rollout_id: t async for t in convert_store(opened, report=ConversionReport())}

    return asyncio.run(run())


def test_runs_page_lists_steps_and_counts(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200
    assert 'data-charts="/api/metrics"' in page.text
    assert '<a href="/steps/1">1</a>' in page.text and '<a href="/steps/2">2</a>' in page.text
    assert "<b>8</b> rollouts" in page.text and "<b>12</b> LLM calls" in page.text


def test_metrics_api_gives_each_curve_with_gaps_for_missing_values(client: TestClient) -> None:
    charts = {chart["id"]: chart for chart in client.get("/api/metrics").json()["charts"]}
    reward = {series["label"]: series["points"] for series in charts["reward"]["series"]}
    assert reward["reward (training rollouts)"] == [[1, 0.5], [2, 0.625]]
    assert reward["held-out reward"] == [[0, 0.25], [1, 0.5]]
    assert charts["loss"]["series"][0]["points"] == [[1, 0.75], [2, None]]  # step 2 trained nothing
    assert [s["label"] for s in charts["gap"]["series"]] == ["mean |Δ logprob|"]
    assert {"reward", "loss", "entropy", "gap", "time"} == set(charts)


def test_rollout_list_shows_rewards_return_advantage_and_status(client: TestClient, scenario_store: Path) -> None:
    page = client.get("/rollouts", params={"group": "s0-0", "sort": "created", "order": "asc"})
    assert rollout_ids(page.text) == ["ro-a1", "ro-a2", "ro-a3"]
    rows = dict(zip(rollout_ids(page.text), page.text.split('<tr data-rollout="')[1:], strict=True))
    assert "correct <b>0.500</b>" in rows["ro-a2"] and "format <b>0.250</b>" in rows["ro-a2"]
    # The trainer's advantages: return − mean over the group's trajectories (1.0, 0.75, 0.0).
    trajectories = converted(scenario_store)
    batch = group_advantages([trajectories[i] for i in ("ro-a1", "ro-a2", "ro-a3")])  # type: ignore[misc]
    for trajectory, advantage in batch.items:
        assert f"{advantage:+.3f}" in rows[trajectory.rollout_id]
    assert "ValueError" not in rows["ro-a3"]  # its final attempt succeeded; the failed one is on its page
    equal = client.get("/rollouts", params={"group": "s0-1"}).text
    assert equal.count("0 (equal returns in the group)") == 2


def test_filters_sort_and_pagination(client: TestClient) -> None:
    assert rollout_ids(client.get("/rollouts", params={"status": "running"}).text) == ["ro-c1"]
    assert rollout_ids(client.get("/rollouts", params={"q": "beta", "order": "asc"}).text) == ["ro-b1", "ro-b2"]
    assert rollout_ids(client.get("/rollouts", params={"step": "2"}).text) == ["ro-c1"]
    assert rollout_ids(client.get("/rollouts", params={"kind": "eval"}).text) == ["ro-e1"]
    assert rollout_ids(client.get("/rollouts", params={"model": "judge"}).text) == ["ro-solo"]
    by_return = rollout_ids(client.get("/rollouts", params={"sort": "return"}).text)
    assert by_return[:3] == ["ro-e1", "ro-b2", "ro-b1"] and by_return[-1] == "ro-c1"  # no reward: last
    ranged = rollout_ids(client.get("/rollouts", params={"min": "0.5", "max": "0.9", "order": "asc"}).text)
    assert ranged == ["ro-a2", "ro-solo"]  # 0.5 + 0.25, and the rollout-level 0.5
    assert rollout_ids(client.get("/rollouts", params={"sort": "attempts"}).text)[0] == "ro-a3"


def test_pages_hold_fifty_rollouts(tmp_path: Path) -> None:
    async def build() -> None:
        async with SQLiteStore(tmp_path / "many.sqlite") as store:
            for index in range(120):
                await store.create_rollout({"n": index}, rollout_id=f"ro-{index:03d}")

    asyncio.run(build())
    viewer = Viewer(tmp_path / "many.sqlite")
    try:
        client = TestClient(create_app(viewer, key=KEY, port=0), headers={"authorization": f"Bearer {KEY}"})
        pages = [rollout_ids(client.get("/rollouts", params={"page": n, "order": "asc"}).text) for n in (1, 2, 3)]
        assert [len(p) for p in pages] == [50, 50, 20]
        assert sum(pages, []) == [f"ro-{index:03d}" for index in range(120)]
        assert "page 3 of 3" in client.get("/rollouts", params={"page": 3}).text
    finally:
        viewer.close()


def test_rollout_timeline_orders_calls_rewards_and_spans_by_sequence(client: TestClient) -> None:
    page = client.get("/rollouts/ro-a2").text
    order = re.findall(r'<li class="item (call|reward|span)"', page)
    assert order == ["call", "span", "call", "reward", "reward"]
    assert '<span class="fn">add</span>' in page  # the response's tool call, parsed
    assert "result of call_1" in page  # the tool message answering it
    assert "1 earlier message, as sent with the previous call" in page
    assert "crewai.tool.add" in page and "tool.result" in page


def test_failed_attempt_shows_its_error_and_traceback(client: TestClient) -> None:
    page = client.get("/rollouts/ro-a3").text
    first = re.search(r'href="/rollouts/ro-a3\?attempt=([^&"]+)&amp;view=timeline">attempt 1', page)
    assert first is not None
    failed = client.get(f"/rollouts/ro-a3?attempt={first[1]}").text
    assert "ValueError: the tool broke" in failed and "Traceback (most recent call last)" in failed
    tokens = client.get(f"/rollouts/ro-a3?attempt={first[1]}&view=tokens").text
    assert "Not trained — failed." in tokens


def test_token_view_shows_exactly_what_the_converter_made(client: TestClient, scenario_store: Path) -> None:
    trajectories = converted(scenario_store)
    for rollout_id in ("ro-a1", "ro-a2", "ro-a3"):
        shown = token_segments(client.get(f"/rollouts/{rollout_id}?view=tokens").text)
        made = trajectories[rollout_id].segments  # type: ignore[attr-defined]
        assert [s["input_ids"] for s in shown] == [list(s.input_ids) for s in made]
        assert [s["loss_mask"] for s in shown] == [list(s.loss_mask) for s in made]
    page = client.get("/rollouts/ro-a3?view=tokens").text
    assert SplitKind.PREFIX_BREAK.value.replace("_", " ") in page
    assert "the template dropped a &lt;think&gt; block" in page  # the split reason, at the second sequence
    assert page.index("Sequence 2") < page.index("The converter started a new sequence here")


def test_token_view_explains_attempts_that_did_not_train(client: TestClient) -> None:
    running = client.get("/rollouts/ro-c1?view=tokens").text
    assert f"Not trained — {DropReason.NOT_FINISHED.value.replace('_', ' ')}." in running
    solo = client.get("/rollouts/ro-solo?view=tokens").text
    assert re.search(r"<li>#1 <span class=\"dim\">text only</span></li>", solo)  # named as not trained
    assert "0 (alone in its group)" in client.get("/rollouts/ro-solo").text


def test_token_text_comes_from_the_model_tokenizer(scenario_store: Path, tiny_model_dir: Path, tiny_tokenizer) -> None:
    viewer = Viewer(scenario_store, model=str(tiny_model_dir))
    try:
        client = TestClient(create_app(viewer, key=KEY, port=0), headers={"authorization": f"Bearer {KEY}"})
        page = client.get("/rollouts/ro-a1?view=tokens").text
        text = tiny_tokenizer.decode([10], skip_special_tokens=False)
        assert re.search(r'data-id="10" data-m="1" data-lp="-0.125" data-v="1">' + re.escape(text) + "<", page)
    finally:
        viewer.close()


def test_call_page_and_comparison(client: TestClient) -> None:
    page = client.get("/rollouts/ro-a2").text
    link = re.search(r'href="(/rollouts/ro-a2/calls/2\?attempt=[^"]+)"', page)
    assert link is not None
    full = client.get(link[1].replace("&amp;", "&")).text
    assert "Messages (3)" in full and "What is 2+2?" in full
    compare = client.get("/compare", params={"a": "ro-a1", "b": "ro-a2", "view": "tokens"})
    assert compare.status_code == 200
    assert len(token_segments(compare.text)) == 2
    assert "same task" in client.get("/rollouts/ro-a1").text  # the way into a comparison


def test_step_and_group_pages(client: TestClient) -> None:
    step = client.get("/steps/1").text
    assert "s0-0" in step and "s0-1" in step and "eval1-12345678-0" in step
    assert "no: equal returns" in step
    group = client.get("/groups/s0-1").text
    assert "every return is equal: the trainer dropped this group" in group


def test_bad_input_gets_a_page_not_a_traceback(client: TestClient) -> None:
    for url, status, words in (
        ("/rollouts/ro-nope", 404, "no rollout 'ro-nope'"),
        ("/rollouts/ro-a1?attempt=at-nope", 404, "has no attempt 'at-nope'"),
        ("/rollouts?status=lost", 400, "status must be one of"),
        ("/rollouts?page=0", 400, "page must be >= 1"),
        ("/rollouts?min=lots", 400, "min must be a number"),
        ("/rollouts/ro-a1?view=nope", 400, "view must be timeline or tokens"),
        ("/groups/g-nope", 404, "no rollouts with group id"),
        ("/steps/99", 404, "step 99"),
        ("/nowhere", 404, "Not Found"),
        ("/compare?a=ro-a1", 400, "compare needs two rollouts"),
    ):
        response = client.get(url)
        assert response.status_code == status, url
        assert words in html.unescape(response.text), (url, response.text[-600:])
        assert "Traceback" not in response.text


def test_store_pages_work_without_metrics(scenario_store: Path, tmp_path: Path) -> None:
    from viewer_helpers import write_run_dir

    viewer = Viewer(scenario_store, write_run_dir(tmp_path / "fresh", metrics=False))
    try:
        client = TestClient(create_app(viewer, key=KEY, port=0), headers={"authorization": f"Bearer {KEY}"})
        runs = client.get("/").text
        assert "No <code>metrics.jsonl</code>" in runs
        assert "Steps in the store" in runs and '<a href="/steps/2">2</a>' in runs
        assert client.get("/api/metrics").json() == {"charts": []} or all(
            not chart["series"] for chart in client.get("/api/metrics").json()["charts"]
        )
        assert client.get("/rollouts/ro-a1").status_code == 200
    finally:
        viewer.close()


def test_a_run_with_rloo_shows_the_leave_one_out_advantages(scenario_store: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text('{"model": null, "advantage": "rloo"}')
    opened = Viewer(scenario_store, run_dir)
    try:
        test_client = TestClient(create_app(opened, key=KEY, port=0))
        test_client.headers["authorization"] = f"Bearer {KEY}"
        page = test_client.get("/rollouts", params={"group": "s0-0", "sort": "created", "order": "asc"}).text
    finally:
        opened.close()
    rows = dict(zip(rollout_ids(page), page.split('<tr data-rollout="')[1:], strict=True))
    trajectories = converted(scenario_store)
    members = [trajectories[i] for i in ("ro-a1", "ro-a2", "ro-a3")]
    plain = {t.rollout_id: a for t, a in group_advantages(members).items}  # type: ignore[arg-type]
    for trajectory, advantage in group_advantages(members, estimator="rloo").items:  # type: ignore[arg-type]
        assert advantage == plain[trajectory.rollout_id] * 3 / 2  # n / (n − 1) for three trajectories
        assert f"{advantage:+.3f}" in rows[trajectory.rollout_id]
