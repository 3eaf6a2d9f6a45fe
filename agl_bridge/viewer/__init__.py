"""`agl-bridge view`: a local web app over a store and a run directory — curves, rollouts, trained tokens.

It reads and never writes: the store is opened read-only (SQLite `mode=ro`), so it can watch a
store that a running `serve` or `train` writes to. Only the CLI imports this package. The pages
and how they are built: docs/viewer.md; the parts: `app` (routes), `db` (read-only store),
`listing` / `timeline` / `trained` (what each page shows), `access` (the key), `server` (uvicorn).
"""
