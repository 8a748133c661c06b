"""Webhooks reach public addresses only, unless the fleet file's [webhooks] allowed_networks says otherwise.

Refused at registration when the URL's host is written as an address (in any form), and refused again
when a delivery connects, whatever a host name resolves to then. No request here leaves loopback: the
refused addresses are refused before any connection is tried, and the delivery-time check is shown with
`localhost`, a name that resolves to loopback, while a receiver listens there and hears nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hyperplan.cli.client import ApiError
from tests.harness import Server, wait_until
from tests.server.test_webhooks import Receiver

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"  # allows loopback, nothing else
REFUSED_EVERYWHERE = [
    "http://169.254.169.254/latest/meta-data/",
    "http://[fe80::1]/hook",
    "http://10.0.0.1/hook",
    "http://192.168.1.20:8080/hook",
    "http://[fd00::1]/hook",
    "http://0.0.0.0:8080/hook",
    "http://[::ffff:169.254.169.254]/hook",
]
LOOPBACK_FORMS = [
    "http://127.0.0.1:9/hook",
    "http://[::1]:9/hook",
    "http://[::ffff:127.0.0.1]:9/hook",
    "http://2130706433:9/hook",  # 127.0.0.1 as one number
    "http://127.1:9/hook",
]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    started = Receiver().start()
    yield started
    started.stop()


def _refused(server: Server, url: str) -> str:
    with pytest.raises(ApiError) as refused:
        server.native().post("/api/v1/webhooks", {"Account": "admin", "Url": url})
    assert refused.value.code == "ValidationException", refused.value.message
    return refused.value.message


def test_non_public_targets_are_refused_at_registration_naming_the_url(
    fast_server: Server, fast_server_factory: type[Server], tmp_path: Path
) -> None:
    for url in REFUSED_EVERYWHERE + LOOPBACK_FORMS:
        message = _refused(fast_server, url)
        assert message.startswith(f"Url {url!r}: ") and "allowed_networks" in message, message
    assert fast_server.native().get("/api/v1/webhooks")["Webhooks"] == []

    loopback_allowed = fast_server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET).start()
    for url in REFUSED_EVERYWHERE:
        _refused(loopback_allowed, url)
    for url in LOOPBACK_FORMS:
        loopback_allowed.native().post("/api/v1/webhooks", {"Account": "admin", "Url": url})


def test_a_name_that_resolves_to_loopback_is_refused_when_a_delivery_connects(
    fast_server: Server, receiver: Receiver
) -> None:
    url = f"http://localhost:{receiver.port}/hooks/hyperplan"
    hook = fast_server.native().post("/api/v1/webhooks", {"Account": "admin", "Url": url})  # a name: accepted
    client = fast_server.sagemaker()
    offering = client.search_training_plan_offerings(
        InstanceType="ml.p5.48xlarge", InstanceCount=1, DurationHours=24, TargetResources=["training-job"]
    )["TrainingPlanOfferings"][0]
    client.create_training_plan(
        TrainingPlanName="hooked", TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )

    def deliveries() -> list[dict[str, Any]]:
        return list(
            fast_server.native().get(f"/api/v1/webhooks/{hook['WebhookId']}/deliveries")["Deliveries"]
        )

    tried = wait_until(lambda: [d for d in deliveries() if d["Attempts"] >= 1])
    assert tried, deliveries()
    for delivery in tried:
        assert delivery["Status"] == "Retrying" and delivery["DeliveredAt"] is None
        assert "refused to connect to localhost" in delivery["LastError"], delivery["LastError"]
        assert "is a loopback address" in delivery["LastError"]
    assert receiver.requests == []  # it listens on that port, and heard nothing
