"""The SageMaker API for the `hyperplan` commands: awsJson1.1 over the native client's transport.

botocore's client would do, but building one loads SageMaker's whole service model, which costs a
command about 0.4 s before its first byte is sent. The commands use a dozen operations, so what the
model would tell them is written down in :mod:`hyperplan.cli.sagemaker_shapes` (which members of each
answer are timestamps, how each list pages) and ``tests/cli/test_sagemaker_client.py`` checks that
table against botocore's model, the ground truth, so it cannot drift. Requests are signed exactly as
the native API's (:mod:`hyperplan.signing`, botocore's own signer).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from hyperplan.cli.client import ApiError, NativeClient
from hyperplan.cli.sagemaker_shapes import OUTPUT_TIMESTAMPS, PAGES
from hyperplan.signing import sign_request

CONTENT_TYPE = "application/x-amz-json-1.1"
TARGET_PREFIX = "SageMaker."


class SageMakerClient:
    """One operation per call, by its wire name: ``client.call("DescribeTrainingPlan", TrainingPlanName=n)``.

    Answers are as botocore gives them: timestamps as aware datetimes, no ResponseMetadata. Errors are
    :class:`ApiError` with the wire's code and message, as the native client's are.
    """

    def __init__(self, native: NativeClient) -> None:
        self.native = native

    @property
    def endpoint(self) -> str:
        return self.native.endpoint

    def call(self, operation: str, **params: Any) -> dict[str, Any]:
        if operation not in OUTPUT_TIMESTAMPS:
            raise ValueError(f"{operation} is not one of the operations the CLI knows")
        body = json.dumps(_wire_value(params)).encode()
        url = f"{self.native.endpoint}/"
        credentials = self.native.credentials
        headers = sign_request(
            "POST",
            url,
            headers={"Content-Type": CONTENT_TYPE, "X-Amz-Target": TARGET_PREFIX + operation},
            body=body,
            access_key=credentials.access_key,
            secret_key=credentials.secret_key,
            region=self.native.server_region(),
            session_token=credentials.session_token,
        )
        status, data = self.native.exchange("POST", url, headers, body)
        answer = _answer(status, data)
        for path in OUTPUT_TIMESTAMPS[operation]:
            _to_datetimes(answer, path.split("."))
        return answer

    def pages(self, operation: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Every page of a listing, following its NextToken until the server gives none."""
        if operation not in PAGES:
            raise ValueError(f"{operation} does not page")
        token: str | None = None
        while True:
            page = self.call(operation, **params, **({"NextToken": token} if token else {}))
            yield page
            token = page.get("NextToken")
            if not token:
                return

    def items(self, operation: str, **params: Any) -> list[dict[str, Any]]:
        """Every item of a listing, across its pages (the member PAGES names)."""
        member = PAGES[operation]
        return [item for page in self.pages(operation, **params) for item in page.get(member, [])]


def _wire_value(value: Any) -> Any:
    """awsJson1.1 sends a timestamp as epoch seconds."""
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, dict):
        return {k: _wire_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_wire_value(v) for v in value]
    return value


def _answer(status: int, data: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(data) if data else {}
    except ValueError:
        raise ApiError("InvalidResponse", data[:500].decode(errors="replace"), status) from None
    if status >= 400:
        payload = payload if isinstance(payload, dict) else {}
        # "__type" may carry a namespace before a '#', as AWS's own services send it.
        code = str(payload.get("__type", "Unknown")).rpartition("#")[2]
        message = payload.get("message", payload.get("Message", ""))
        raise ApiError(code, str(message), status)
    if not isinstance(payload, dict):
        raise ApiError("InvalidResponse", "the answer is not a JSON object", status)
    return payload


def _to_datetimes(value: Any, path: list[str]) -> None:
    """Turn the epoch seconds at ``path`` (members, ``[]`` for every item of a list) into datetimes."""
    if not path or value is None:
        return
    head, rest = path[0], path[1:]
    if head == "[]":
        for item in value if isinstance(value, list) else ():
            _to_datetimes(item, rest)
        return
    if not isinstance(value, dict) or head not in value:
        return
    if rest:
        _to_datetimes(value[head], rest)
    elif isinstance(value[head], int | float):
        value[head] = datetime.fromtimestamp(value[head], UTC)
