"""One agent's huge request never stalls the others, and never grows the proxy without bound.

A body over the limit is a 413 from its declared length (or once a chunked body grows past the
limit); a prompt that cannot fit the context window is refused by its length before it is
tokenized; a large prompt that might fit is tokenized in a worker thread. Small requests of other
rollouts keep their idle latency meanwhile (p99 within 2x, idle and loaded blocks measured in
alternation and compared pair by pair, so the machine's other load does not decide it), and the
proxy's peak RSS grows by less than `RSS_GROWTH_BOUND_MIB` (one 20 MB request used to grow it by
~1.1 GB). `bench/proxy_oversize.py` prints the same figures.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agl_bridge.testing.oversize import LIMIT_BYTES, measure_oversize
from agl_bridge.testing.proxy_process import start_proxy

RSS_GROWTH_BOUND_MIB = 150


@pytest.mark.slow
def test_oversized_requests_are_refused_without_stalling_small_ones(tmp_path: Path, tiny_model_dir: Path) -> None:
    proxy = start_proxy(tmp_path / "store.sqlite", tiny_model_dir, max_request_bytes=LIMIT_BYTES)
    try:
        report = measure_oversize(proxy)
    finally:
        proxy.stop()
    figures = report.summary()
    assert set(report.refusals) == {(413, "request_too_large"), (400, "context_length_exceeded")}, figures
    assert sum(report.refusals.values()) >= 4, f"the oversized requests must overlap the small ones: {figures}"
    assert report.paired_p99_ratio <= 2, figures
    assert report.rss_growth_mib < RSS_GROWTH_BOUND_MIB, figures
