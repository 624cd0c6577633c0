"""The webhook registered by a Service reference, as the chart's Deployment runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kai_ray import controller
from kai_ray.effects.certificates import ensure_certificate


async def test_a_service_webhook_is_registered_by_service_with_the_ca(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = controller.OperatorOptions(webhook_service="kai-ray-system/kr-webhook")
    monkeypatch.setattr(controller, "OPTIONS", options)
    files = ensure_certificate(tmp_path, "kr-webhook.kai-ray-system.svc")
    server = controller.ServiceWebhookServer(
        addr="127.0.0.1",
        port=0,
        certfile=str(files.cert_file),
        pkeyfile=str(files.key_file),
        cafile=str(files.ca_file),
    )

    async def review(
        request: object, *, webhook: object = None, headers: object = None, sslpeer: object = None
    ) -> dict[str, object]:
        return {}

    served = server(review)
    try:
        config = await anext(served)
    finally:
        await served.aclose()
    assert "url" not in config
    assert config["service"] == {
        "namespace": "kai-ray-system",
        "name": "kr-webhook",
        "port": 443,
        "path": "",
    }
    assert config["caBundle"]


def test_the_service_names_the_certificate() -> None:
    assert controller._service_dns_name("ns/svc") == "svc.ns.svc"
