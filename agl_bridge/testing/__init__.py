"""The reliability harness shared by the test suite and the benchmarks; the library itself never imports it.

- `proxy_process`: a proxy in a subprocess (`serve.py`: instant, slow-streaming or tiny-model
  sampler) that a test or benchmark can kill, freeze and restart; `child_env` for any subprocess.
- `load`: N concurrent rollouts × K turns through a proxy, then the store checked call by call.
- `fuzz`: hypothesis strategies of well- and ill-formed requests and the check of each answer
  (needs `hypothesis`, a dev dependency).
- `checks`: the OpenAI error-shape check and a store file's integrity check.
- `agents`: agent sources a test or benchmark writes into a run's folder.

Nothing is imported here, so `import agl_bridge.testing.<module>` loads only what it needs.
"""
