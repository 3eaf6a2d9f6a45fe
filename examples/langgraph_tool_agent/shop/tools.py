"""The agent's tools: `lookup_price(item)` in the episode's price table, and `order_total(quantity, price)`, the
till's total with the episode's delivery fee (which only this tool knows).

They are plain typed Python functions: LangChain's `create_agent` turns them into tools, their names,
argument types and docstrings into the JSON schemas the model is shown. `tool_signatures` reads those
schemas back (LangChain's own conversion), so the well-formed rule checks a call against exactly what the
model was told.

Their results are written so that the agent's next value is a copy of them: `lookup_price` answers
'{"price": 7}' (JSON, as the `price` argument of the order_total call is written), `order_total` answers
"The total is 31.", the sentence the agent answers the customer with.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import Any


def shop_tools(prices: Mapping[str, int], fee: int) -> list[Callable[..., str]]:
    """The two tools of an episode whose price table is `prices` and delivery fee `fee`."""

    def lookup_price(item: str) -> str:
        """The price of one unit of an item, as JSON."""
        if item not in prices:
            raise ValueError(f"no item {item!r} in the shop")
        return json.dumps({"price": prices[item]})

    def order_total(quantity: int, price: int) -> str:
        """What `quantity` units at `price` each cost with the delivery fee, as a sentence for the customer."""
        return total_sentence(quantity * price + fee)

    return [lookup_price, order_total]


def total_sentence(total: int) -> str:
    """`order_total`'s result, and the answer the customer is given: "The total is 31." """
    return f"The total is {total}."


def tool_schemas() -> list[dict[str, Any]]:
    """The tools as the OpenAI `tools` entries the agent sends (LangChain's conversion, as `bind_tools` does)."""
    from langchain_core.utils.function_calling import convert_to_openai_tool

    return [convert_to_openai_tool(tool) for tool in shop_tools({}, 0)]


@functools.cache
def tool_signatures() -> dict[str, dict[str, str]]:
    """{tool name: {argument: JSON-schema type}}, every argument required, read off `tool_schemas`."""
    signatures = {}
    for schema in tool_schemas():
        function = schema["function"]
        properties = function["parameters"]["properties"]
        signatures[function["name"]] = {name: spec["type"] for name, spec in properties.items()}
    return signatures
