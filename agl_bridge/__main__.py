"""`python -m agl_bridge`: the `agl-bridge` command line."""

from __future__ import annotations

from agl_bridge.cli import app

if __name__ == "__main__":
    app(prog_name="agl-bridge")
