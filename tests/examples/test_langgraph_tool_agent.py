"""The LangGraph shop agent's rules, fast: the task split, the careless teacher, the well-formed rule, and the
reward and reason of every way an episode ends — played by the real LangGraph agent against replies answered
in memory (no proxy, no model)."""

from __future__ import annotations

import random
from collections import Counter

import langgraph_tool_agent_helpers  # noqa: F401  (puts the example on the import path)
import pytest
from langgraph_tool_agent_helpers import Script, answer, call
from shop.agent import MAX_TURNS, SYSTEM_PROMPT
from shop.outcome import REASONS, stated_total, well_formed
from shop.tasks import FEES, ITEMS, PRICES, QUANTITIES, held_out_tasks, pair_split, phase_tasks, total, user_message
from shop.teacher import CarelessTeacher, play_with, reply_text, teacher_episode, warm_start_episodes
from shop.tools import shop_tools, tool_schemas, tool_signatures

from agl_bridge.chat import ChatCodec
from agl_bridge.chat.tool_calls import parse_tool_calls


def pair_of(task: dict) -> tuple[int, int]:
    return task["quantity"], task["prices"][task["item"]]


def test_the_pairs_are_split_once_and_held_out_tasks_use_only_held_out_pairs() -> None:
    training, held_out = pair_split()
    assert len(training) == 52 and len(held_out) == 20
    assert not set(training) & set(held_out)
    assert set(training) | set(held_out) == {(q, p) for q in QUANTITIES for p in PRICES}
    assert pair_split() == (training, held_out), "fixed whatever the run"
    held = held_out_tasks()
    assert held == held_out_tasks()
    assert Counter(pair_of(task) for task in held) == dict.fromkeys(held_out, 2)
    for seed in (0, 1):
        for phase in ("warm_start", "rl"):
            assert {pair_of(task) for task in phase_tasks(phase, 300, seed)} <= set(training)
    seeds = [{t["seed"] for t in tasks} for tasks in (phase_tasks("warm_start", 500), phase_tasks("rl", 500), held)]
    seeds.append({t["seed"] for t in phase_tasks("rl", 500, seed=1)})
    assert all(not a & b for i, a in enumerate(seeds) for b in seeds[i + 1 :]), "every phase and run: its own seeds"
    with pytest.raises(ValueError, match="held_out_tasks"):
        phase_tasks("held_out", 1)
    with pytest.raises(ValueError, match="run seed"):
        phase_tasks("rl", 1, seed=10_000)


def test_every_task_has_its_own_price_table_and_fee_and_asks_for_its_total() -> None:
    tasks = phase_tasks("rl", 200)
    for task in tasks:
        assert task["item"] in ITEMS and set(task["prices"]) == set(ITEMS)
        assert all(price in PRICES for price in task["prices"].values()) and task["fee"] in FEES
        assert total(task) == task["quantity"] * task["prices"][task["item"]] + task["fee"]
        ticket = f'{{"item": "{task["item"]}", "quantity": {task["quantity"]}}}'
        # the fee is not in the question: only order_total knows it
        assert user_message(task) == f"Order: {ticket}. What does it cost?"
    assert len({tuple(sorted(t["prices"].items())) for t in tasks}) > 150, "prices cannot be memorised"
    assert set(FEES) == {t["fee"] for t in tasks}


def test_the_tools_are_described_to_the_model_by_langchain() -> None:
    assert tool_signatures() == {
        "lookup_price": {"item": "string"},
        "order_total": {"quantity": "integer", "price": "integer"},
    }
    assert [s["function"]["name"] for s in tool_schemas()] == ["lookup_price", "order_total"]
    lookup_price, order_total = shop_tools({"pear": 7}, fee=3)
    assert lookup_price("pear") == '{"price": 7}' and order_total(4, 7) == "The total is 31."


def test_every_value_the_agent_writes_is_copied_from_its_context_after_the_same_tokens(tiny_tokenizer) -> None:
    # What makes the task learnable by a small transformer: each value is an induction copy, the tokens before
    # it in the reply occur earlier in the prompt, always followed by that value.
    codec = ChatCodec(tiny_tokenizer)
    for task in phase_tasks("warm_start", 20):
        pairs, _ = teacher_episode(task, random.Random(0), 0.0, codec)
        turns = [[task["item"]], [task["quantity"], task["prices"][task["item"]]], [total(task)]]
        for (prompt, response), values in zip(pairs, turns, strict=True):
            prompt_ids = codec.encode_prompt(prompt["messages"], prompt["tools"]).token_ids
            reply_ids = tiny_tokenizer(response, add_special_tokens=False)["input_ids"]
            after = 4
            for value in values:
                value_ids = tiny_tokenizer(str(value), add_special_tokens=False)["input_ids"]
                at = next(i for i in range(after, len(reply_ids)) if reply_ids[i : i + len(value_ids)] == value_ids)
                after = at + len(value_ids)
                key = reply_ids[at - 4 : at]
                followers = [
                    prompt_ids[i + 4 : i + 4 + len(value_ids)]
                    for i in range(len(prompt_ids) - 4)
                    if prompt_ids[i : i + 4] == key
                ]
                assert followers and all(f == value_ids for f in followers), (task["id"], value, followers)


def test_a_careful_teacher_looks_up_asks_the_total_and_answers_as_the_template_writes_it(tiny_tokenizer) -> None:
    task = phase_tasks("warm_start", 1)[0]
    price, quantity = task["prices"][task["item"]], task["quantity"]
    pairs, outcome = teacher_episode(task, random.Random(0), 0.0, ChatCodec(tiny_tokenizer))
    assert outcome.reward == 1.0 and outcome.reason == "correct"
    assert [response for _, response in pairs] == [
        f'<tool_call>\n{{"name": "lookup_price", "arguments": {{"item": "{task["item"]}"}}}}\n</tool_call>',
        '<tool_call>\n{"name": "order_total", "arguments": '
        f'{{"quantity": {quantity}, "price": {price}}}}}\n</tool_call>',
        f"The total is {total(task)}.",
    ]
    prompts = [prompt for prompt, _ in pairs]
    assert prompts[0]["messages"] == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": user_message(task)},
    ]
    assert all(prompt["tools"] == tool_schemas() for prompt in prompts), "the tools as LangChain sends them"
    for earlier, later in zip(prompts, prompts[1:], strict=False):
        assert later["messages"][: len(earlier["messages"])] == earlier["messages"]
        assert [m["role"] for m in later["messages"][len(earlier["messages"]) :]] == ["assistant", "tool"]
    assert prompts[1]["messages"][-1]["content"] == f'{{"price": {price}}}'
    assert prompts[2]["messages"][-1]["content"] == f"The total is {total(task)}."


def test_the_proxy_reads_a_teachers_reply_back_as_the_call_the_agent_sent(tiny_tokenizer) -> None:
    codec = ChatCodec(tiny_tokenizer)
    task = phase_tasks("warm_start", 1)[0]
    pairs, _ = teacher_episode(task, random.Random(0), 0.0, codec)
    for (prompt, text), (later, _) in zip(pairs, pairs[1:], strict=False):
        sent = later["messages"][len(prompt["messages"])]  # the call as LangGraph sent it back
        parsed = parse_tool_calls(text)
        assert not parsed.errors and parsed.content is None
        assert [(c.function.name, c.function.arguments) for c in parsed.tool_calls] == [
            (c["function"]["name"], c["function"]["arguments"]) for c in sent["tool_calls"]
        ]
        assert reply_text(codec, prompt["messages"], prompt["tools"], sent) == text


def test_a_careless_teacher_cuts_corners_and_every_turn_is_kept(tiny_tokenizer) -> None:
    tasks = phase_tasks("warm_start", 200)
    pairs, outcomes = warm_start_episodes(tasks, 0, 0.5, tiny_tokenizer)
    reasons = Counter(o.reason for o in outcomes)
    assert set(reasons) == {"correct", "wrong total"}
    # careful at both decisions a quarter of the time; a guessed total is rarely right
    assert 0.15 < reasons["correct"] / len(outcomes) < 0.4, reasons
    used = Counter(tuple(o.tool_calls) for o in outcomes)
    assert used[("lookup_price", "order_total")] and used[()] and used[("order_total",)] and used[("lookup_price",)]
    assert len(pairs) == sum(len(o.tool_calls) + 1 for o in outcomes), "every model call of every episode"
    reckless, _ = warm_start_episodes(tasks[:50], 0, 1.0, tiny_tokenizer)
    assert not any("lookup_price" in response for _, response in reckless)
    with pytest.raises(ValueError, match="shortcut_rate"):
        CarelessTeacher(tasks[0], random.Random(0), 1.5)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("28", True),
        ("The total is 28.", True),
        ("", True),
        ('<tool_call>\n{"name": "lookup_price", "arguments": {"item": "pear"}}\n</tool_call>', True),
        ('<tool_call>\n{"name": "order_total", "arguments": {"quantity": 4, "price": 7}}\n</tool_call>', True),
        ('Sure.\n<tool_call>\n{"name": "order_total", "arguments": {"quantity": 4, "price": 7}}\n</tool_call>', True),
        (
            '<tool_call>\n{"name": "lookup_price", "arguments": {"item": "pear"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "order_total", "arguments": {"quantity": 4, "price": 7}}\n</tool_call>',
            True,
        ),
        # bad JSON
        ('<tool_call>\n{"name": "order_total", "arguments": {"quantity": 4, "price": 7}\n</tool_call>', False),
        ('<tool_call>\n{"name": "order_total", "arguments": {"quantity": 4, "price": 7}}', False),  # unterminated
        # an unknown tool
        ('<tool_call>\n{"name": "divide", "arguments": {"quantity": 4, "price": 7}}\n</tool_call>', False),
        ('<tool_call>\n{"name": "order_total", "arguments": {"quantity": 4}}\n</tool_call>', False),  # missing argument
        ('<tool_call>\n{"name": "order_total", "arguments": {"quantity": 4, "price": 7, "c": 1}}\n</tool_call>', False),
        # a string
        ('<tool_call>\n{"name": "order_total", "arguments": {"quantity": "4", "price": 7}}\n</tool_call>', False),
        # a bool
        ('<tool_call>\n{"name": "order_total", "arguments": {"quantity": true, "price": 7}}\n</tool_call>', False),
        ('<tool_call>\n{"name": "lookup_price", "arguments": {"item": 3}}\n</tool_call>', False),
        ('<tool_call>\n{"name": "lookup_price", "arguments": "pear"}\n</tool_call>', False),
        ("</tool_call> 28", False),
        (
            '<tool_call>\n{"name": "lookup_price", "arguments": {"item": "pear"}}\n</tool_call>\n<tool_call>\n{"na',
            False,
        ),
    ],
)
def test_the_well_formed_rule(text: str, expected: bool) -> None:
    assert well_formed(text) is expected


def test_the_answer_states_its_last_number() -> None:
    assert stated_total("28") == 28
    assert stated_total("4 units at 7 each cost 28.") == 28
    assert stated_total("28, or maybe 30") == 30
    assert stated_total("I don't know") is None


def full_episode(task: dict, final: str) -> Script:
    price = task["prices"][task["item"]]
    return Script(
        [
            call("lookup_price", item=task["item"]),
            call("order_total", quantity=task["quantity"], price=price),
            answer(final),
        ]
    )


def test_an_episode_is_rewarded_for_the_right_total_only() -> None:
    task = phase_tasks("rl", 1)[0]
    right = total(task)
    for final, reward, reason in (
        (str(right), 1.0, "correct"),
        (f"The total is {right}.", 1.0, "correct"),
        (str(right + 1), 0.0, "wrong total"),
        ("I cannot say.", 0.0, "no total"),
    ):
        outcome, _, requests = play_with(full_episode(task, final), task)
        assert (outcome.reward, outcome.reason) == (reward, reason), outcome
        assert outcome.tool_calls == ("lookup_price", "order_total") and len(requests) == 3
    outcome, _, requests = play_with(Script([answer(str(right))]), task)
    assert (outcome.reward, outcome.reason, outcome.tool_calls, len(requests)) == (1.0, "correct", (), 1)


def test_a_tool_call_that_does_not_parse_ends_the_episode_with_its_reason() -> None:
    task = phase_tasks("rl", 1)[0]
    # What the proxy answers for a sampled block that is not JSON: the text stays in the content.
    broken = '<tool_call>\n{"name": "lookup_price", "arguments": {"item": "pear"}\n</tool_call>'
    outcome, messages, requests = play_with(Script([answer(broken), answer("5")]), task)
    assert (outcome.reward, outcome.reason, len(requests)) == (0.0, "malformed tool call", 1)
    assert messages[-1].content == broken, "LangGraph saw a plain answer and stopped"
    # Arguments the proxy passes on as text that is not JSON: LangChain keeps the call as invalid.
    unreadable = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup_price", "arguments": "pear"}}],
    }
    outcome, _, requests = play_with(Script([unreadable, answer("5")]), task)
    assert (outcome.reward, outcome.reason, len(requests)) == (0.0, "malformed tool call", 1)


@pytest.mark.parametrize(
    ("bad_call", "told"),
    [
        (call("lookup_price", item="kiwi"), "Error: no item 'kiwi' in the shop"),
        (call("divide", a=1, b=2), "Error: divide is not a valid tool"),
        (call("order_total", quantity="four", price=7), "Error invoking tool 'order_total'"),
    ],
)
def test_a_failing_tool_call_is_told_to_the_model_and_the_episode_goes_on(bad_call: dict, told: str) -> None:
    task = phase_tasks("rl", 1)[0]
    script = full_episode(task, str(total(task)))
    script.replies.insert(0, bad_call)
    outcome, _, requests = play_with(script, task)
    tool_message = requests[1][0]["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["content"].startswith(told)
    assert (outcome.reward, outcome.reason, len(requests)) == (1.0, "correct", 4)


def test_an_episode_past_its_turn_limit_ends_with_that_reason() -> None:
    task = phase_tasks("rl", 1)[0]
    outcome, messages, requests = play_with(Script([call("lookup_price", item=task["item"])]), task)
    assert (outcome.reward, outcome.reason) == (0.0, "turn limit")
    assert len(requests) == MAX_TURNS and outcome.tool_calls == ("lookup_price",) * MAX_TURNS
    assert messages, "the conversation up to the limit is kept"
    # At the limit the last turn may still answer.
    script = Script([call("lookup_price", item=task["item"])] * (MAX_TURNS - 1) + [answer(str(total(task)))])
    outcome, _, requests = play_with(script, task)
    assert (outcome.reason, len(requests)) == ("correct", MAX_TURNS)
    assert set(REASONS) == {"correct", "wrong total", "no total", "malformed tool call", "turn limit"}
