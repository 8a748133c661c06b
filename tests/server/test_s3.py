"""S3 on hyperplan's own endpoint (issue 22, point 4): the directory buckets, served to the `aws` CLI and
boto3 as S3 serves them.

In process (tests/inprocess.py): the server, the store, the buckets' directories, the `aws` CLI and boto3
are real. The raw requests (aws-chunked bodies, bad members) are signed by botocore's S3 signer
(tests/server/s3_requests.py).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import urllib.request
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
import boto3.s3.transfer
import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from hyperplan.objects import served as files
from hyperplan.server.limits import MIB, ServerLimits
from hyperplan.signing import Credentials
from hyperplan.wire import s3_model
from hyperplan.wire.s3_responses import NAMESPACE
from tests.harness import ADMIN, REGION
from tests.inprocess import InProcessServer, Templates
from tests.server.bad_xml import bad_documents
from tests.server.s3_requests import crc32, sha256_b64, signed, streaming_put

pytestmark = pytest.mark.aws


def s3(server: InProcessServer, who: Credentials = ADMIN, **config: Any) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=server.url,
        region_name=REGION,
        aws_access_key_id=who.access_key,
        aws_secret_access_key=who.secret_key,
        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}, **config),
    )


def _error(call: Any) -> tuple[int, str, str]:
    with pytest.raises(ClientError) as caught:
        call()
    response = caught.value.response
    return (
        response["ResponseMetadata"]["HTTPStatusCode"],
        response["Error"]["Code"],
        response["Error"].get("Message", ""),
    )


def cli(server: InProcessServer, *args: str, who: Credentials = ADMIN) -> str:
    """The `aws` CLI's output (its s3 commands print text, not JSON)."""
    process = server.aws(*args, credentials=who, check=False)
    assert process.returncode == 0, (args, process.stdout, process.stderr)
    return str(process.stdout)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, store_templates: Templates) -> Iterator[InProcessServer]:
    """One server for the module (each test its own accounts and buckets): the small fleet, plus a bucket
    kept on an S3-compatible endpoint (which S3 here does not proxy)."""
    directory = tmp_path_factory.mktemp("s3")
    fleet = directory / "fleet.toml"
    fleet.write_text(
        SMALL_FLEET.read_text()
        + f'\n[buckets.elsewhere]\nendpoint_url = "http://127.0.0.1:9"\nregion = "{REGION}"\n'
    )
    limits = ServerLimits(s3_max_body_bytes=7 * MIB)  # S3's cap, low enough to pass in a test
    started = InProcessServer(
        data_dir=directory / "data", templates=store_templates, fleet=fleet, limits=limits
    ).start()
    yield started
    started.close()


def test_aws_cli_syncs_and_lists_nested_prefixes_and_presigned_links_work(
    server: InProcessServer, tmp_path: Path
) -> None:
    alpha = server.new_account("alpha")
    s3(server, alpha).create_bucket(Bucket="alpha-data")
    local = tmp_path / "local"
    for relative, text in {
        "a.txt": "top",
        "data/train/part-0.csv": "1,2\n",
        "data/train/part-1.csv": "3,4\n",
        "data/test/x y+z.csv": "5,6\n",
    }.items():
        (local / relative).parent.mkdir(parents=True, exist_ok=True)
        (local / relative).write_text(text)

    cli(server, "s3", "sync", str(local), "s3://alpha-data/", who=alpha)
    listing = cli(server, "s3", "ls", "--recursive", "s3://alpha-data/", who=alpha)
    assert [line.split(maxsplit=3)[-1] for line in listing.splitlines()] == [
        "a.txt",
        "data/test/x y+z.csv",
        "data/train/part-0.csv",
        "data/train/part-1.csv",
    ]
    # The bucket is a directory: what the CLI wrote is there, byte for byte; a sync down brings it back.
    assert _tree(server.data_dir / "s3" / "alpha-data") == _tree(local)
    down = tmp_path / "down"
    cli(server, "s3", "sync", "s3://alpha-data/data", str(down), who=alpha)
    assert _tree(down) == _tree(local / "data")

    # A presigned GET is a plain link, as the CLI v1 presigns (Signature Version 2, its default for an
    # endpoint URL) and as with SigV4 (the CLI v2's way, `s3.signature_version = s3v4`); a PUT too.
    legacy = cli(server, "s3", "presign", "s3://alpha-data/a.txt", "--expires-in", "300", who=alpha)
    assert "AWSAccessKeyId=" in legacy
    with urllib.request.urlopen(legacy.strip()) as answer:
        assert answer.read() == b"top"
    v4 = s3(server, alpha, signature_version="s3v4").generate_presigned_url(
        "get_object", Params={"Bucket": "alpha-data", "Key": "a.txt"}, ExpiresIn=300
    )
    assert "X-Amz-Credential=" in v4
    with urllib.request.urlopen(v4) as answer:
        assert answer.read() == b"top"
    assert httpx.get(v4.replace("a.txt", "data/train/part-0.csv")).status_code == 403  # not what was signed
    for style in ("s3", "s3v4"):
        put_url = s3(server, alpha, signature_version=style).generate_presigned_url(
            "put_object", Params={"Bucket": "alpha-data", "Key": f"up/{style}.txt"}, ExpiresIn=300
        )
        request = urllib.request.Request(
            put_url, data=b"from a link", method="PUT", headers={"Content-Type": ""}
        )
        with urllib.request.urlopen(request) as answer:
            assert answer.status == 200
        assert (server.data_dir / "s3" / "alpha-data" / "up" / f"{style}.txt").read_bytes() == b"from a link"
    # A link signed two hours ago for one hour has expired (X-Amz-Expires is checked).
    then = datetime.now(UTC).replace(tzinfo=None) - timedelta(hours=2)
    with mock.patch("botocore.auth.get_current_datetime", return_value=then):
        stale = s3(server, alpha, signature_version="s3v4").generate_presigned_url(
            "get_object", Params={"Bucket": "alpha-data", "Key": "a.txt"}, ExpiresIn=3600
        )
    refused = httpx.get(stale)
    assert refused.status_code == 403 and b"<Code>AccessDenied</Code>" in refused.content
    assert b"expired" in refused.content

    # A multipart upload as boto3's transfer manager makes it: two parts, one object, no parts left over.
    body = os.urandom(6 << 20)
    (tmp_path / "six.bin").write_bytes(body)
    transfer = boto3.s3.transfer.TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
    s3(server, alpha).upload_file(str(tmp_path / "six.bin"), "alpha-data", "big/six.bin", Config=transfer)
    assert (server.data_dir / "s3" / "alpha-data" / "big" / "six.bin").read_bytes() == body
    assert s3(server, alpha).head_object(Bucket="alpha-data", Key="big/six.bin")["ETag"].endswith('-2"')
    assert not list((server.data_dir / "s3-uploads").iterdir())


def test_boto3_objects_listing_ranges_copies_and_s3_errors(server: InProcessServer) -> None:
    client = s3(server)
    client.create_bucket(Bucket="things", CreateBucketConfiguration={"LocationConstraint": REGION})
    assert _error(lambda: client.create_bucket(Bucket="things"))[:2] == (409, "BucketAlreadyOwnedByYou")
    for index in range(7):
        client.put_object(
            Bucket="things",
            Key=f"logs/day-{index}.txt",
            Body=f"line {index}".encode(),
            Metadata={"n": str(index)},
        )
    client.put_object(Bucket="things", Key="logs-index.txt", Body=b"index", ContentType="text/plain")
    client.put_object(Bucket="things", Key="deep/a/b/c.txt", Body=b"abc")

    # ListObjectsV2: pages of 3 follow continuation tokens; a delimiter rolls keys up into prefixes.
    keys, token, pages = [], None, 0
    while True:
        page = client.list_objects_v2(
            Bucket="things", MaxKeys=3, **({"ContinuationToken": token} if token else {})
        )
        keys += [item["Key"] for item in page.get("Contents", [])]
        pages += 1
        if not page["IsTruncated"]:
            break
        token = page["NextContinuationToken"]
    assert pages == 3
    assert keys == sorted(keys, key=lambda k: k.encode()) and len(keys) == 9
    assert keys[:2] == ["deep/a/b/c.txt", "logs-index.txt"]  # '-' sorts before '/'
    rolled = client.list_objects_v2(Bucket="things", Delimiter="/")
    assert [p["Prefix"] for p in rolled["CommonPrefixes"]] == ["deep/", "logs/"]
    assert [c["Key"] for c in rolled["Contents"]] == ["logs-index.txt"]
    paged = client.list_objects_v2(Bucket="things", Delimiter="/", MaxKeys=1)
    second = client.list_objects_v2(
        Bucket="things", Delimiter="/", MaxKeys=5, ContinuationToken=paged["NextContinuationToken"]
    )
    assert [p["Prefix"] for p in paged["CommonPrefixes"]] + [
        p["Prefix"] for p in second.get("CommonPrefixes", [])
    ] == ["deep/", "logs/"]
    prefixed = client.list_objects_v2(Bucket="things", Prefix="logs/day-1")
    assert [c["Key"] for c in prefixed["Contents"]] == ["logs/day-1.txt"]

    # GetObject with ranges; HeadObject; metadata and content type kept.
    assert client.get_object(Bucket="things", Key="logs/day-3.txt", Range="bytes=2-3")["Body"].read() == b"ne"
    assert client.get_object(Bucket="things", Key="logs/day-3.txt", Range="bytes=-1")["Body"].read() == b"3"
    ranged = client.get_object(Bucket="things", Key="logs/day-3.txt", Range="bytes=5-")
    assert ranged["ContentRange"] == "bytes 5-5/6" and ranged["Body"].read() == b"3"
    assert _error(lambda: client.get_object(Bucket="things", Key="logs/day-3.txt", Range="bytes=6-"))[:2] == (
        416,
        "InvalidRange",
    )
    head = client.head_object(Bucket="things", Key="logs/day-3.txt")
    assert head["Metadata"] == {"n": "3"} and head["ContentLength"] == 6
    assert head["ETag"] == '"' + hashlib.md5(b"line 3").hexdigest() + '"'
    assert client.head_object(Bucket="things", Key="logs-index.txt")["ContentType"] == "text/plain"

    # CopyObject, DeleteObject(s).
    client.copy_object(
        Bucket="things", Key="copies/day-3.txt", CopySource={"Bucket": "things", "Key": "logs/day-3.txt"}
    )
    assert client.get_object(Bucket="things", Key="copies/day-3.txt")["Body"].read() == b"line 3"
    deleted = client.delete_objects(
        Bucket="things", Delete={"Objects": [{"Key": f"logs/day-{i}.txt"} for i in range(7)]}
    )
    assert len(deleted["Deleted"]) == 7
    client.delete_object(Bucket="things", Key="copies/day-3.txt")
    assert [c["Key"] for c in client.list_objects_v2(Bucket="things")["Contents"]] == [
        "deep/a/b/c.txt",
        "logs-index.txt",
    ]

    # S3's errors, in S3's XML.
    assert _error(lambda: client.get_object(Bucket="things", Key="nothing"))[:2] == (404, "NoSuchKey")
    assert _error(lambda: client.head_object(Bucket="things", Key="nothing"))[0] == 404
    assert _error(lambda: client.list_objects_v2(Bucket="no-such-bucket"))[:2] == (404, "NoSuchBucket")
    assert _error(lambda: client.head_bucket(Bucket="no-such-bucket"))[0] == 404
    assert _error(lambda: client.delete_bucket(Bucket="things"))[:2] == (409, "BucketNotEmpty")
    assert _error(lambda: client.put_object(Bucket="things", Key="a/../b", Body=b"x"))[:2] == (
        400,
        "InvalidArgument",
    )
    too_big = _error(lambda: client.put_object(Bucket="things", Key="huge", Body=b"x" * (7 * MIB + 1)))
    assert too_big[:2] == (400, "EntityTooLarge") and "7340032 bytes (7 MiB)" in too_big[2]
    assert _error(lambda: client.list_objects_v2(Bucket="things", MaxKeys=-1))[:2] == (400, "InvalidArgument")
    wrong_md5 = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    assert _error(lambda: client.put_object(Bucket="things", Key="x", Body=b"x", ContentMD5=wrong_md5))[
        :2
    ] == (400, "BadDigest")
    status, code, message = _error(lambda: client.list_objects_v2(Bucket="elsewhere"))
    assert (status, code) == (400, "InvalidRequest") and "AWS_ENDPOINT_URL_S3" in message
    # A body that is not the one signed is refused, and nothing is written.
    answer, _, _ = signed(
        server.url,
        "PUT",
        "/things/swapped.txt",
        body=b"real",
        payload_hash=hashlib.sha256(b"fake").hexdigest(),
    )
    assert answer.status_code == 400 and b"XAmzContentSHA256Mismatch" in answer.content
    assert not (server.data_dir / "s3" / "things" / "swapped.txt").exists()
    assert not [
        p for p in (server.data_dir / "s3" / "things").iterdir() if p.name.startswith(".hyperplan-tmp-")
    ]


def test_aws_chunked_bodies_with_checksum_trailers_are_checked(server: InProcessServer) -> None:
    s3(server).create_bucket(Bucket="chunks")
    data = os.urandom(200_000)
    root = server.data_dir / "s3" / "chunks"
    for mode in ("STREAMING-UNSIGNED-PAYLOAD-TRAILER", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"):
        ok = streaming_put(
            server.url, f"/chunks/{mode}", data, mode=mode, trailer=("x-amz-checksum-crc32", crc32(data))
        )
        assert ok.status_code == 200, ok.text
        assert ok.headers["x-amz-checksum-crc32"] == crc32(data)
        assert (root / mode).read_bytes() == data
        wrong = streaming_put(
            server.url,
            f"/chunks/wrong-{mode}",
            data,
            mode=mode,
            trailer=("x-amz-checksum-crc32", crc32(b"other")),
        )
        assert wrong.status_code == 400 and b"<Code>BadDigest</Code>" in wrong.content, wrong.text
        assert not (root / f"wrong-{mode}").exists()
    sha = streaming_put(
        server.url,
        "/chunks/sha",
        data,
        mode="STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        trailer=("x-amz-checksum-sha256", sha256_b64(data)),
    )
    assert sha.status_code == 200, sha.text
    crc32c = streaming_put(
        server.url,
        "/chunks/c",
        b"123456789",
        mode="STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        trailer=("x-amz-checksum-crc32c", "4waSgw=="),
    )
    assert crc32c.status_code == 200, crc32c.text  # CRC-32C's check value, 0xE3069283
    # Signed chunks without a trailer: each chunk's signature chains from the request's.
    signed_ok = streaming_put(server.url, "/chunks/signed", data, mode="STREAMING-AWS4-HMAC-SHA256-PAYLOAD")
    assert signed_ok.status_code == 200 and (root / "signed").read_bytes() == data
    forged = streaming_put(
        server.url, "/chunks/forged", data, mode="STREAMING-AWS4-HMAC-SHA256-PAYLOAD", corrupt_chunk=True
    )
    assert forged.status_code == 403 and b"SignatureDoesNotMatch" in forged.content
    assert not (root / "forged").exists()
    assert not [p for p in root.iterdir() if p.name.startswith(".hyperplan-tmp-")]


def test_another_accounts_buckets_are_invisible_and_refused(server: InProcessServer) -> None:
    alpha, beta = server.new_account("owner-a"), server.new_account("other-b")
    a, b = s3(server, alpha), s3(server, beta)
    a.create_bucket(Bucket="alpha-private")
    a.put_object(Bucket="alpha-private", Key="secret.txt", Body=b"mine")
    b.create_bucket(Bucket="beta-own")
    assert [x["Name"] for x in b.list_buckets()["Buckets"]] == ["beta-own"]
    assert "alpha-private" in [x["Name"] for x in s3(server).list_buckets()["Buckets"]]  # the administrator
    for call in (
        lambda: b.get_object(Bucket="alpha-private", Key="secret.txt"),
        lambda: b.put_object(Bucket="alpha-private", Key="x", Body=b"x"),
        lambda: b.list_objects_v2(Bucket="alpha-private"),
        lambda: b.delete_object(Bucket="alpha-private", Key="secret.txt"),
        lambda: b.copy_object(
            Bucket="beta-own", Key="stolen", CopySource={"Bucket": "alpha-private", "Key": "secret.txt"}
        ),
        lambda: b.create_multipart_upload(Bucket="alpha-private", Key="x"),
        lambda: b.delete_bucket(Bucket="alpha-private"),
    ):
        assert _error(call)[:2] == (403, "AccessDenied")
    assert _error(lambda: b.head_bucket(Bucket="alpha-private"))[0] == 403
    assert _error(lambda: b.create_bucket(Bucket="alpha-private"))[:2] == (409, "BucketAlreadyExists")
    assert (server.data_dir / "s3" / "alpha-private" / "secret.txt").read_bytes() == b"mine"
    # Unsigned: S3's AccessDenied, in XML; the health check and SageMaker are where they were.
    unsigned = httpx.get(f"{server.url}/alpha-private/secret.txt")
    assert unsigned.status_code == 403 and b"<Code>AccessDenied</Code>" in unsigned.content
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    # Virtual-hosted style: Host BUCKET.HOST names an existing bucket.
    hosted, _, _ = signed(
        server.url,
        "GET",
        "/secret.txt",
        headers={"Host": f"alpha-private.localhost:{server.port}"},
        credentials=alpha,
    )
    assert hosted.status_code == 200 and hosted.content == b"mine"


def test_model_derived_bad_members_are_refused_with_4xx(server: InProcessServer) -> None:
    """Every integer, boolean and enum query or header member of the served operations, given a value
    its shape refuses, is answered 400 InvalidArgument naming the member."""
    s3(server).create_bucket(Bucket="checked")
    paths = {
        "ListObjectsV2": ("GET", "/checked?list-type=2"),
        "ListObjects": ("GET", "/checked"),
        "GetObject": ("GET", "/checked/k"),
        "HeadObject": ("HEAD", "/checked/k"),
        "PutObject": ("PUT", "/checked/k"),
        "UploadPart": ("PUT", "/checked/k?partNumber=1&uploadId=abc"),
        "ListParts": ("GET", "/checked/k?uploadId=abc"),
        "DeleteObject": ("DELETE", "/checked/k"),
    }
    tried = 0
    for operation, (method, path) in paths.items():
        for member, location, where, shape in s3_model._located(operation):
            bad = {"integer": "NaN", "long": "NaN", "boolean": "maybe"}.get(shape.type_name)
            if bad is None and shape.type_name == "string" and shape.enum:
                bad = "NOT-A-VALUE"
            if bad is None or where in ("uploadId", "partNumber", "list-type", "content-length"):
                continue
            if location == "querystring":
                separator = "&" if "?" in path else "?"
                answer, _, _ = signed(server.url, method, f"{path}{separator}{where}={bad}")
            else:
                answer, _, _ = signed(server.url, method, path, headers={where: bad})
            assert 400 <= answer.status_code < 500, (operation, member, answer.status_code, answer.text)
            if method != "HEAD":
                assert b"InvalidArgument" in answer.content and member.encode() in answer.content, answer.text
            tried += 1
    assert tried >= 20


def test_model_derived_bad_xml_bodies_are_refused_with_s3s_codes(server: InProcessServer) -> None:
    """Every operation that takes an XML body, given documents derived from a valid one that each break
    one rule of the payload's shape in botocore's model, answers 400 with S3's code; nothing is done."""
    client = s3(server)
    client.create_bucket(Bucket="xml-bodies")
    client.put_object(Bucket="xml-bodies", Key="tagged", Body=b"x")
    upload = client.create_multipart_upload(Bucket="xml-bodies", Key="parts")["UploadId"]
    valid = {
        "CreateBucket": (
            "PUT", "/xml-new", f"<CreateBucketConfiguration><LocationConstraint>{REGION}</LocationConstraint>"
            "</CreateBucketConfiguration>",
        ),
        "DeleteObjects": (
            "POST", "/xml-bodies?delete",
            "<Delete><Object><Key>tagged</Key></Object><Quiet>true</Quiet></Delete>",
        ),
        "CompleteMultipartUpload": (
            "POST", f"/xml-bodies/parts?uploadId={upload}",
            '<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>"e"</ETag></Part>'
            "</CompleteMultipartUpload>",
        ),
        "PutObjectTagging": (
            "PUT", "/xml-bodies/tagged?tagging",
            "<Tagging><TagSet><Tag><Key>k</Key><Value>v</Value></Tag></TagSet></Tagging>",
        ),
    }  # fmt: skip
    tried = 0
    for operation, (method, path, text) in valid.items():
        found = s3_model.payload(operation)
        assert found is not None, operation
        document = ElementTree.fromstring(text)
        for element in document.iter():  # in S3's namespace, as the SDKs send it
            element.tag = f"{{{NAMESPACE}}}{element.tag}"
        for description, body in bad_documents(found[1], document):
            answer, _, _ = signed(server.url, method, path, body=body)
            enum = "LocationConstraint> = 'NOT" in description
            expected = "InvalidLocationConstraint" if enum else "MalformedXML"
            assert answer.status_code == 400, (operation, description, answer.text)
            assert f"<Code>{expected}</Code>" in answer.text, (operation, description, answer.text)
            tried += 1
    assert tried >= 25
    assert "xml-new" not in [b["Name"] for b in client.list_buckets()["Buckets"]]
    assert client.head_object(Bucket="xml-bodies", Key="tagged")["ContentLength"] == 1
    assert client.get_object_tagging(Bucket="xml-bodies", Key="tagged")["TagSet"] == []
    assert client.list_parts(Bucket="xml-bodies", Key="parts", UploadId=upload).get("Parts", []) == []


def test_unfinished_uploads_are_listed_to_abort_parts_copied_and_objects_tagged(
    server: InProcessServer,
) -> None:
    """ListMultipartUploads (what `aws s3api list-multipart-uploads` lists after an interrupted upload),
    UploadPartCopy (a range of an object, read rights on its bucket) and object tagging."""
    alpha, beta = server.new_account("uploader-a"), server.new_account("uploader-b")
    a, b = s3(server, alpha), s3(server, beta)
    a.create_bucket(Bucket="unfinished")
    a.put_object(Bucket="unfinished", Key="source.bin", Body=bytes(range(256)) * 40)  # 10240 bytes
    b.create_bucket(Bucket="beta-source")
    b.put_object(Bucket="beta-source", Key="theirs", Body=b"not yours")
    started = {key: a.create_multipart_upload(Bucket="unfinished", Key=key)["UploadId"] for key in (
        "runs/1/model.tar", "runs/2/model.tar", "top.bin",
    )}  # fmt: skip
    second = a.create_multipart_upload(Bucket="unfinished", Key="top.bin")["UploadId"]
    listed = json.loads(cli(server, "s3api", "list-multipart-uploads", "--bucket", "unfinished", who=alpha))
    assert [(u["Key"], u["UploadId"]) for u in listed["Uploads"]] == [
        ("runs/1/model.tar", started["runs/1/model.tar"]),
        ("runs/2/model.tar", started["runs/2/model.tar"]),
        ("top.bin", started["top.bin"]),
        ("top.bin", second),
    ]
    rolled = a.list_multipart_uploads(Bucket="unfinished", Delimiter="/")
    assert [p["Prefix"] for p in rolled["CommonPrefixes"]] == ["runs/"]
    assert [u["Key"] for u in rolled["Uploads"]] == ["top.bin", "top.bin"]
    pages: list[list[str]] = []
    marker: dict[str, str] = {}
    while True:
        page = a.list_multipart_uploads(Bucket="unfinished", MaxUploads=1, **marker)
        pages.append([u["UploadId"] for u in page.get("Uploads", [])])
        if not page["IsTruncated"]:
            break
        marker = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}
    assert pages == [
        [started["runs/1/model.tar"]],
        [started["runs/2/model.tar"]],
        [started["top.bin"]],
        [second],
    ]
    assert b.list_multipart_uploads(Bucket="beta-source").get("Uploads", []) == []  # only one's own
    assert _error(lambda: b.list_multipart_uploads(Bucket="unfinished"))[:2] == (403, "AccessDenied")

    # A part copied from a range of an object; the whole object as another; then the upload completed.
    copied = a.upload_part_copy(
        Bucket="unfinished", Key="top.bin", UploadId=second, PartNumber=2,
        CopySource={"Bucket": "unfinished", "Key": "source.bin"}, CopySourceRange="bytes=10-19",
    )  # fmt: skip
    assert (
        copied["CopyPartResult"]["ETag"]
        == '"' + hashlib.md5((bytes(range(256)) * 40)[10:20]).hexdigest() + '"'
    )
    whole = a.upload_part_copy(
        Bucket="unfinished", Key="top.bin", UploadId=second, PartNumber=1,
        CopySource={"Bucket": "unfinished", "Key": "source.bin"},
    )  # fmt: skip
    for refused, code in (
        (lambda: a.upload_part_copy(
            Bucket="unfinished", Key="top.bin", UploadId=second, PartNumber=3,
            CopySource={"Bucket": "beta-source", "Key": "theirs"},
        ), (403, "AccessDenied")),
        (lambda: a.upload_part_copy(
            Bucket="unfinished", Key="top.bin", UploadId=second, PartNumber=3,
            CopySource={"Bucket": "unfinished", "Key": "source.bin"}, CopySourceRange="bytes=0-10240",
        ), (400, "InvalidArgument")),
    ):  # fmt: skip
        assert _error(refused)[:2] == code
    parts = [
        {"PartNumber": 1, "ETag": whole["CopyPartResult"]["ETag"]},
        {"PartNumber": 2, "ETag": copied["CopyPartResult"]["ETag"]},
    ]
    assert _error(
        lambda: a.complete_multipart_upload(
            Bucket="unfinished", Key="top.bin", UploadId=second, MultipartUpload={"Parts": parts}
        )
    )[:2] == (400, "EntityTooSmall")  # the first part is under 5 MiB: S3's rule holds for copies too
    cli(server, "s3api", "abort-multipart-upload", "--bucket", "unfinished", "--key", "top.bin",
        "--upload-id", second, who=alpha)  # fmt: skip
    assert second not in [u["UploadId"] for u in a.list_multipart_uploads(Bucket="unfinished")["Uploads"]]

    # Tags: put, read back, replaced, removed; S3's limits hold; another account cannot read them.
    tags = [{"Key": "team", "Value": "vision"}, {"Key": "run", "Value": "42"}]
    a.put_object_tagging(Bucket="unfinished", Key="source.bin", Tagging={"TagSet": tags})
    assert a.get_object_tagging(Bucket="unfinished", Key="source.bin")["TagSet"] == tags
    assert a.head_object(Bucket="unfinished", Key="source.bin")["ContentLength"] == 10240  # the object stays
    too_many = [{"Key": f"k{i}", "Value": "v"} for i in range(11)]
    for bad in (
        too_many,
        [{"Key": "k", "Value": "1"}, {"Key": "k", "Value": "2"}],
        [{"Key": "k" * 129, "Value": ""}],
    ):
        answer = _error(
            lambda bad=bad: a.put_object_tagging(
                Bucket="unfinished", Key="source.bin", Tagging={"TagSet": bad}
            )
        )
        assert answer[:2] == (400, "InvalidTag"), answer
    assert _error(lambda: b.get_object_tagging(Bucket="unfinished", Key="source.bin"))[:2] == (
        403,
        "AccessDenied",
    )
    assert _error(lambda: a.get_object_tagging(Bucket="unfinished", Key="nothing"))[:2] == (404, "NoSuchKey")
    a.delete_object_tagging(Bucket="unfinished", Key="source.bin")
    assert a.get_object_tagging(Bucket="unfinished", Key="source.bin")["TagSet"] == []
    # Versioning and ACLs are not served: S3's NotImplemented, in S3's XML.
    for call in (
        lambda: a.get_bucket_versioning(Bucket="unfinished"),
        lambda: a.get_object_acl(Bucket="unfinished", Key="source.bin"),
    ):
        assert _error(call)[:2] == (501, "NotImplemented")


def _long_key(n: int) -> str:
    """About 1,000 bytes (S3's keys are at most 1,024), longer once written: each '&' is 3 bytes
    URL-encoded (boto3 asks for encoding-type=url) and 5 as XML, each 'é' 6 URL-encoded."""
    return f"{n:04d}/" + "a" * 250 + "/" + "&" * 250 + "/" + "é" * 120 + "/" + "z" * 240


def _answers_sizes(client: Any, operation: str) -> list[int]:
    """The byte size of each answer `operation` gets, as sent."""
    sizes: list[int] = []
    client.meta.events.register(
        f"after-call.s3.{operation}", lambda http_response, **_: sizes.append(len(http_response.content))
    )
    return sizes


def test_listings_of_long_keys_come_a_page_of_at_most_1_mib_and_go_on_exactly(
    server: InProcessServer,
) -> None:
    """ListObjectsV2, ListObjects and ListMultipartUploads end a page at 1 MiB of entries (issue 42;
    core/s3_listing.py), truncated as by their count, and their tokens and markers go on exactly."""
    owner = server.new_account("long-keys")
    client = s3(server, owner)
    client.create_bucket(Bucket="long-keys")
    keys = [_long_key(n) for n in range(1200)]
    root = server.data_dir / "s3" / "long-keys"
    for key in keys:  # written in place: the bucket is a directory (a PUT a key would take a second)
        (root / key).parent.mkdir(parents=True)
        (root / key).write_bytes(b"x")

    sizes = _answers_sizes(client, "ListObjectsV2")
    listed, asked = [], {}
    while True:
        page = client.list_objects_v2(Bucket="long-keys", **asked)
        assert 0 < page["KeyCount"] < 1000  # the bytes ended the page, not the count
        listed += [item["Key"] for item in page["Contents"]]
        if not page["IsTruncated"]:
            break
        asked = {"ContinuationToken": page["NextContinuationToken"]}
    assert listed == keys and len(sizes) == 3 and max(sizes) <= MIB + 1024  # the entries and the header

    sizes = _answers_sizes(client, "ListObjects")
    listed, marker = [], ""
    while True:
        old = client.list_objects(Bucket="long-keys", Marker=marker)
        listed += [item["Key"] for item in old["Contents"]]
        if not old["IsTruncated"]:
            break
        marker = old.get("NextMarker", listed[-1])  # S3: NextMarker with a delimiter, else the last key
    assert listed == keys and len(sizes) == 3 and max(sizes) <= MIB + 1024

    account_id = server.native(owner).get("/api/v1/whoami")["AccountId"]
    uploads = [  # started in place too, as CreateMultipartUpload starts one
        files.start_upload(server.data_dir, "long-keys", key, account_id, None, {}) for key in keys[:900]
    ]
    sizes = _answers_sizes(client, "ListMultipartUploads")
    seen, asked = [], {}
    while True:
        found = client.list_multipart_uploads(Bucket="long-keys", **asked)
        seen += [upload["UploadId"] for upload in found["Uploads"]]
        if not found["IsTruncated"]:
            break
        asked = {"KeyMarker": found["NextKeyMarker"], "UploadIdMarker": found["NextUploadIdMarker"]}
    assert seen == [upload.upload_id for upload in uploads] and len(sizes) == 3 and max(sizes) <= MIB + 1024


def test_list_parts_caps_max_parts_at_1000_keeping_its_page_small(server: InProcessServer) -> None:
    """ListParts needs no cut by bytes: its page holds at most 1,000 parts of under 200 bytes each
    (server/s3/multipart.py), whatever max-parts asks."""
    client = s3(server)
    client.create_bucket(Bucket="parted")
    upload = client.create_multipart_upload(Bucket="parted", Key="k" * 1024)["UploadId"]
    client.upload_part(Bucket="parted", Key="k" * 1024, UploadId=upload, PartNumber=1, Body=b"x")
    parts = client.list_parts(Bucket="parted", Key="k" * 1024, UploadId=upload, MaxParts=5000)
    assert parts["MaxParts"] == 1000 and [part["PartNumber"] for part in parts["Parts"]] == [1]
