"""The training modes over one run: online GRPO, offline GRPO, follow mode, the supervised warm start
and DPO, each a loop of its own over the primitives of `agl_bridge.primitives`.

This is the composition layer of a training run: it starts the in-process proxy over the sampler,
runs the agent through the runner, converts what the store recorded, and trains.
`agl_bridge.train.grpo.GRPOTrainer` is its entry point (the CLI's `agl-bridge train`).
"""
