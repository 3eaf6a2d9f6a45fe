"""A shop-till tool agent on LangGraph (LangChain's `create_agent`), trained through agl_bridge.

- `tasks`: the shop tasks and the held-out split of (quantity, price) pairs;
- `tools`: the agent's two tools, `lookup_price` and `order_total`;
- `agent`: the agent itself — `shop_agent(task, endpoint)`, the trainer's entry point;
- `outcome`: an episode's reward and the reason for it, and the well-formed tool-call rule;
- `telemetry`: the outcome recorded as a span in the rollout;
- `teacher`: the careless scripted player whose episodes are the warm-start data;
- `metrics`: the held-out evaluations read back from a run's store.
"""
