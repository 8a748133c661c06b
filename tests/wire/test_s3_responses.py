"""S3's answers checked against botocore's model (hyperplan/wire/s3_responses.py): a right answer
passes, and each kind of wrong one is caught, by the check and by the endpoint that runs it."""

from __future__ import annotations

import os
from typing import Any
from unittest import mock

import pytest
from starlette.responses import Response

from hyperplan.server.s3 import endpoint
from hyperplan.wire import model, s3_responses
from tests.harness import check_query_response

NS = s3_responses.NAMESPACE


def _listing(inner: str, namespace: str = NS) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="{namespace}"><Name>b</Name>'
        f"<Prefix></Prefix><MaxKeys>1000</MaxKeys><KeyCount>1</KeyCount>{inner}</ListBucketResult>"
    ).encode()


OK = '<IsTruncated>false</IsTruncated><Contents><Key>k</Key><LastModified>2026-12-01T10:00:00.000Z</LastModified><ETag>"e"</ETag><Size>3</Size><StorageClass>STANDARD</StorageClass></Contents>'  # noqa: E501


def test_a_right_answer_passes_and_each_kind_of_wrong_one_is_named() -> None:
    headers = {"content-type": "application/xml", "x-amz-request-id": "R"}
    assert s3_responses.problems("ListObjectsV2", 200, headers, _listing(OK)) == []
    wrong = {
        "an unknown element": _listing(OK + "<Shiny>1</Shiny>"),
        "a count that is not a number": _listing(OK.replace("<Size>3</Size>", "<Size>three</Size>")),
        "a boolean that is not one": _listing(OK.replace(">false<", ">no<")),
        "an enum's stranger": _listing(OK.replace("STANDARD", "PAPER")),
        "a time that is not one": _listing(OK.replace("2026-12-01T10:00:00.000Z", "yesterday")),
        "a single member twice": _listing(OK + "<KeyCount>2</KeyCount>"),
        "another namespace": _listing(OK, "urn:elsewhere"),
        "not XML": b"<ListBucketResult",
    }
    for what, body in wrong.items():
        assert s3_responses.problems("ListObjectsV2", 200, headers, body), what
    assert s3_responses.problems("ListObjectsV2", 204, headers, _listing(OK)) == [
        "status 204, the model's is 200"
    ]
    unknown_header = s3_responses.problems("PutObject", 200, {"x-amz-shiny": "1", "etag": '"e"'}, b"")
    assert unknown_header == ["header 'x-amz-shiny' is not a member of the output"]
    assert s3_responses.problems("HeadObject", 200, {"content-length": "many"}, b"")
    assert s3_responses.problems("HeadObject", 200, {"last-modified": "a while ago"}, b"")
    assert s3_responses.problems("HeadObject", 200, {"x-amz-meta-colour": "blue"}, b"") == []  # a map
    assert s3_responses.problems("DeleteBucket", 204, {}, b"<Deleted/>")  # the model has no body
    assert s3_responses.problems("DeleteObject", 200, {}, b"")  # the model's status is 204
    assert s3_responses.problems("GetObject", 206, {"content-range": "bytes 0-1/5"}, None) == []
    # An error is S3's <Error> with a Code and a Message.
    assert s3_responses.problems("GetObject", 404, {}, b"<Error><Code>NoSuchKey</Code></Error>")
    assert (
        s3_responses.problems("GetObject", 404, {}, b"<Error><Code>X</Code><Message>m</Message></Error>")
        == []
    )


def test_the_endpoint_answers_500_instead_of_an_answer_the_model_does_not_allow() -> None:
    good = Response(_listing(OK), media_type="application/xml")
    bad = Response(_listing(OK + "<Shiny>1</Shiny>"), media_type="application/xml")
    with mock.patch.dict(os.environ, {s3_responses.ENVIRONMENT: "1"}):
        assert endpoint._checked("ListObjectsV2", good, "R", "/b") is good
        refused = endpoint._checked("ListObjectsV2", bad, "R", "/b")
    assert refused.status_code == 500
    assert b"<Code>InternalError</Code>" in refused.body and b"unknown element &lt;Shiny&gt;" in refused.body


def test_the_query_protocols_check_catches_a_member_the_model_lacks() -> None:
    """tests/harness.py's check of STS's answers, which tests/server/test_aws_logs.py's clients run."""
    operation = model.operation_model("GetCallerIdentity", model.STS)

    def answer(inner: str) -> dict[str, Any]:
        body = (
            '<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
            f"<GetCallerIdentityResult>{inner}</GetCallerIdentityResult>"
            "<ResponseMetadata><RequestId>r</RequestId></ResponseMetadata></GetCallerIdentityResponse>"
        )
        return {"status_code": 200, "headers": {}, "body": body.encode()}

    right = "<UserId>AIDA1</UserId><Account>123456789012</Account><Arn>arn:aws:iam::123456789012:root</Arn>"
    check_query_response(operation, answer(right))
    for wrong in (right + "<Shiny>1</Shiny>", right + "<Account>2</Account>", "<UserId><Inner/></UserId>"):
        with pytest.raises(AssertionError):
            check_query_response(operation, answer(wrong))
