"""Every request is signed by a known, unrevoked key; freshness follows the real clock, not the service's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest
from botocore.exceptions import ClientError

from hyperplan.signing import Credentials
from tests.harness import ADMIN, Server, signed_post


def _code(exc: pytest.ExceptionInfo[ClientError]) -> str:
    return str(exc.value.response["Error"]["Code"])


def test_unsigned_request_is_refused(fast_shared_server: Server) -> None:
    response = httpx.post(
        f"{fast_shared_server.url}/", content=b"{}", headers={"X-Amz-Target": "SageMaker.ListTrainingPlans"}
    )
    assert response.status_code == 403
    assert response.json()["__type"] == "MissingAuthenticationTokenException"


def test_unknown_access_key_is_refused(fast_shared_server: Server) -> None:
    client = fast_shared_server.sagemaker(Credentials("AKHPNOSUCHKEY0000000", "whatever"))
    with pytest.raises(ClientError) as exc:
        client.list_training_plans()
    assert _code(exc) == "UnrecognizedClientException"
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_wrong_secret_is_refused(fast_shared_server: Server) -> None:
    client = fast_shared_server.sagemaker(Credentials(ADMIN.access_key, "not-the-secret"))
    with pytest.raises(ClientError) as exc:
        client.list_training_plans()
    assert _code(exc) == "InvalidSignatureException"
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_signature_twenty_minutes_old_is_refused(fast_shared_server: Server) -> None:
    twenty_minutes_ago = datetime.now(UTC).replace(tzinfo=None) - timedelta(minutes=20)
    response = signed_post(
        fast_shared_server, "SageMaker.ListTrainingPlans", b"{}", signed_at=twenty_minutes_ago
    )
    assert response.status_code == 403
    assert response.json()["__type"] == "InvalidSignatureException"
    assert "expired" in response.json()["message"]


def test_fresh_signature_works_after_the_manual_clock_moves_a_week(fast_server: Server) -> None:
    fast_server.native().post("/api/v1/clock/advance", {"Duration": "7d"})
    assert fast_server.sagemaker().list_training_plans()["TrainingPlanSummaries"] == []
    response = signed_post(fast_server, "SageMaker.ListTrainingPlans", b"{}")
    assert response.status_code == 200


def test_revoked_key_is_refused_on_its_next_request(fast_shared_server: Server) -> None:
    team = fast_shared_server.new_account("revoked-team")
    client = fast_shared_server.sagemaker(team)
    assert client.list_training_plans()["TrainingPlanSummaries"] == []
    fast_shared_server.native(team).post("/api/v1/keys")  # not the account's last active key
    fast_shared_server.cli("accounts", "revoke-key", team.access_key)
    with pytest.raises(ClientError) as exc:
        client.list_training_plans()
    assert _code(exc) == "UnrecognizedClientException"


def test_the_aws_cli_is_authenticated_and_refused_with_a_bad_key(fast_shared_server: Server) -> None:
    assert fast_shared_server.aws("sagemaker", "list-training-plans") == {"TrainingPlanSummaries": []}
    refused = fast_shared_server.aws(
        "sagemaker", "list-training-plans", credentials=Credentials("AKHPNOSUCHKEY0000000", "x"), check=False
    )
    assert refused.returncode != 0
    assert "UnrecognizedClientException" in refused.stderr
