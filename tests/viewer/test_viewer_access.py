"""The key gate and the headers every page carries."""

from __future__ import annotations

from starlette.testclient import TestClient
from viewer_helpers import KEY

from agl_bridge.viewer.access import cookie_name
from agl_bridge.viewer.app import Viewer, create_app


def test_pages_need_the_key(viewer: Viewer) -> None:
    client = TestClient(create_app(viewer, key=KEY, port=8765))
    for url in ("/", "/rollouts", "/rollouts/ro-a1", "/api/version", "/api/metrics"):
        response = client.get(url)
        assert response.status_code == 401 and "needs its key" in response.text, url
    assert client.get("/", headers={"authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/?key=wrong", follow_redirects=False).status_code == 401
    assert client.get("/static/viewer.css").status_code == 200  # assets carry no data


def test_key_in_the_url_becomes_a_cookie_and_leaves_the_address(viewer: Viewer) -> None:
    client = TestClient(create_app(viewer, key=KEY, port=8765))
    response = client.get(f"/rollouts?status=succeeded&key={KEY}", follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == "/rollouts?status=succeeded"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{cookie_name(8765)}={KEY}") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert client.get("/rollouts?status=succeeded").status_code == 200  # the client kept the cookie


def test_every_response_forbids_loading_anything_from_elsewhere(client: TestClient) -> None:
    for url in ("/", "/rollouts/ro-a1?view=tokens", "/rollouts/ro-nope", "/static/viewer.js"):
        policy = client.get(url).headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src 'self'" in policy and "connect-src 'self'" in policy
    page = client.get("/rollouts/ro-a2").text
    assert "http://" not in page and "https://" not in page  # no outside address in what is served
    assert "<script>" not in page and " style=" not in page  # nothing inline the policy would block


def test_an_agent_key_does_not_open_the_viewer(viewer: Viewer) -> None:
    """The viewer has its own key; an agent key minted under that same key (an operator who reused it) opens
    nothing there, by header, by URL or as a cookie."""
    from agl_bridge.agent_keys import AgentKeys

    agent_key = AgentKeys(KEY).mint("ro-a1", "at-0")
    client = TestClient(create_app(viewer, key=KEY, port=8765))
    assert client.get("/rollouts/ro-a1", headers={"authorization": f"Bearer {agent_key}"}).status_code == 401
    assert client.get(f"/rollouts/ro-a1?key={agent_key}", follow_redirects=False).status_code == 401
    client.cookies.set(cookie_name(8765), agent_key)
    assert client.get("/api/metrics").status_code == 401
