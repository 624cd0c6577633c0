"""kopf's session to the API server: as kopf would make it, with a bound on its
connections (a burst of a thousand Queues opened hundreds without one)."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import kopf
import pytest

from kai_ray import controller

CA = "-----BEGIN CERTIFICATE-----\n"


def kubeconfig(folder: Path) -> Path:
    path = folder / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: here\n"
        "clusters:\n- name: here\n  cluster:\n    server: https://127.0.0.1:6443\n"
        "    insecure-skip-tls-verify: true\n"
        "users:\n- name: me\n  user:\n    token: secret-token\n"
        "contexts:\n- name: here\n  context:\n    cluster: here\n    user: me\n"
        "    namespace: team-a\n"
    )
    return path


async def test_login_gives_a_session_with_bounded_connections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path)))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    context = await controller.login(
        logger=logging.getLogger("test"), settings=kopf.OperatorSettings()
    )
    assert isinstance(context, kopf.AiohttpSession)
    session = context.aiohttp_session
    try:
        assert context.server == "https://127.0.0.1:6443"
        assert context.default_namespace == "team-a"
        assert session.connector is not None
        assert session.connector.limit == controller.API_CONNECTIONS
        assert 0 < controller.API_CONNECTIONS <= 32
        assert session.headers["Authorization"] == "Bearer secret-token"
    finally:
        await session.close()


async def test_bounded_session_keeps_basic_credentials() -> None:
    info = kopf.ConnectionInfo(
        server="https://10.0.0.1", username="u", password="p", insecure=True, priority=7
    )
    context = controller.bounded_session(info)
    try:
        expected = "Basic " + base64.b64encode(b"u:p").decode()
        assert context.aiohttp_session.headers["Authorization"] == expected
        assert context.priority == 7
    finally:
        await context.aiohttp_session.close()
