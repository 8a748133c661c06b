"""The one error tree of hyperplan.

Every error a caller can see is a subclass of :class:`HyperplanError`. Each class sets only ``code``
(the AWS error shape name, sent as ``__type`` on the SageMaker wire and as ``Code`` on the native API)
and ``status`` (the HTTP status). ``hyperplan.server.errors`` is the one place that turns them into
responses; anything else that escapes a handler is a bug and becomes a logged 500 ``InternalFailure``.

    HyperplanError
    ├── ValidationError            ValidationException            400  bad input, named member and rule
    ├── ResourceNotFound           ResourceNotFound               400  absent, or another account's
    ├── ResourceInUse              ResourceInUse                  400  name already taken
    ├── ResourceLimitExceeded      ResourceLimitExceeded          400  capacity or quota exhausted
    ├── Conflict                   ConflictException              400  state does not allow the change
    ├── BucketAlreadyExists        BucketAlreadyExists            409  a bucket of that name exists (S3's)
    │   └── BucketAlreadyYours     BucketAlreadyExists            409  the caller's own (S3: ...OwnedByYou)
    ├── ProtocolError              (request could not be understood)
    │   ├── UnknownOperation       UnknownOperationException      400
    │   ├── UnknownRoute           UnknownOperationException      404  no such path
    │   ├── MethodNotAllowed       UnknownOperationException      405  the path takes other methods
    │   ├── SerializationError     SerializationException         400
    │   ├── RequestTooLarge        RequestTooLargeException       413  body over the server's cap
    │   └── RequestTimeout         RequestTimeoutException        408  body not complete in time
    ├── AuthError                  (request could not be trusted)
    │   ├── MissingAuthenticationToken  MissingAuthenticationTokenException  403
    │   ├── UnrecognizedClient     UnrecognizedClientException    403
    │   ├── InvalidSignature       InvalidSignatureException      403
    │   │   └── SignatureExpired   InvalidSignatureException      403  outside its time (S3: AccessDenied)
    │   └── AccessDenied           AccessDeniedException          403  not an administrator
    │       └── BucketAccessDenied AccessDeniedException          403  S3's AccessDenied: the account may
    │                                                                  not use the bucket the URI names
    ├── S3Error                    (S3's own codes, answered as S3's XML by server/s3)
    │   ├── NoSuchBucket, NoSuchKey, NoSuchUpload                 404
    │   ├── BucketNotEmpty                                        409
    │   ├── InvalidRange                                          416
    │   ├── BadDigest, InvalidDigest, ContentSha256Mismatch (XAmzContentSHA256Mismatch), EntityTooLarge,
    │   │   EntityTooSmall, IncompleteBody, InvalidBucketName, InvalidArgument, InvalidS3Request
    │   │   (InvalidRequest), MalformedXML, InvalidPart, InvalidPartOrder       400
    │   ├── S3NotImplemented       NotImplemented                 501
    │   └── S3MethodNotAllowed     MethodNotAllowed               405
    ├── ServiceUnavailable         ServiceUnavailable             503  the server is stopping, or the cluster
    │                                                                  does not answer now; try again
    ├── MasterKeyUnavailable       MasterKeyUnavailable           500  the key file that opens the store's
    │                                                                  secrets is missing, unreadable or wrong
    └── InternalFailure            InternalFailure                500  a bug; never raised on purpose
"""

from __future__ import annotations


class HyperplanError(Exception):
    code = "InternalFailure"
    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class ValidationError(HyperplanError):
    code = "ValidationException"
    status = 400


class InvalidParameter(HyperplanError):
    """A parameter out of what an operation takes, in services whose error for it is not SageMaker's
    ValidationException (CloudWatch Logs)."""

    code = "InvalidParameterException"
    status = 400


class ResourceNotFound(HyperplanError):
    code = "ResourceNotFound"
    status = 400


class ResourceInUse(HyperplanError):
    code = "ResourceInUse"
    status = 400


class ResourceLimitExceeded(HyperplanError):
    code = "ResourceLimitExceeded"
    status = 400


class Conflict(HyperplanError):
    code = "ConflictException"
    status = 400


class BucketAlreadyExists(HyperplanError):
    """S3's answer to creating a bucket whose name is taken, by any account or by the fleet file."""

    code = "BucketAlreadyExists"
    status = 409


class BucketAlreadyYours(BucketAlreadyExists):
    """The caller's own bucket (S3 answers BucketAlreadyOwnedByYou)."""


class ProtocolError(HyperplanError):
    status = 400


class UnknownOperation(ProtocolError):
    code = "UnknownOperationException"


class UnknownRoute(ProtocolError):
    code = "UnknownOperationException"
    status = 404


class MethodNotAllowed(ProtocolError):
    code = "UnknownOperationException"
    status = 405


class SerializationError(ProtocolError):
    code = "SerializationException"


class RequestTooLarge(ProtocolError):
    code = "RequestTooLargeException"
    status = 413


class RequestTimeout(ProtocolError):
    code = "RequestTimeoutException"
    status = 408


class AuthError(HyperplanError):
    status = 403


class MissingAuthenticationToken(AuthError):
    code = "MissingAuthenticationTokenException"


class UnrecognizedClient(AuthError):
    code = "UnrecognizedClientException"


class InvalidSignature(AuthError):
    code = "InvalidSignatureException"


class SignatureExpired(InvalidSignature):
    """A signature outside its time: past a presigned URL's expiry, or too far from the server's clock."""


class AccessDenied(AuthError):
    code = "AccessDeniedException"


class Throttling(HyperplanError):
    """An account's request rate limit: AWS answers 400 with this code, and its tools retry it."""

    code = "ThrottlingException"
    status = 400


class BucketAccessDenied(AccessDenied):
    """S3's AccessDenied for a bucket the account may not read (or write); the message names the URI."""


# -- S3's own refusals (server/s3), each with S3's code and status --------------------------------------


class S3Error(HyperplanError):
    code = "InvalidRequest"
    status = 400


class NoSuchBucket(S3Error):
    code = "NoSuchBucket"
    status = 404


class NoSuchKey(S3Error):
    code = "NoSuchKey"
    status = 404


class NoSuchUpload(S3Error):
    code = "NoSuchUpload"
    status = 404


class BucketNotEmpty(S3Error):
    code = "BucketNotEmpty"
    status = 409


class InvalidRange(S3Error):
    code = "InvalidRange"
    status = 416


class BadDigest(S3Error):
    code = "BadDigest"


class InvalidDigest(S3Error):
    code = "InvalidDigest"


class ContentSha256Mismatch(S3Error):
    code = "XAmzContentSHA256Mismatch"


class EntityTooLarge(S3Error):
    code = "EntityTooLarge"


class EntityTooSmall(S3Error):
    code = "EntityTooSmall"


class IncompleteBody(S3Error):
    code = "IncompleteBody"


class InvalidBucketName(S3Error):
    code = "InvalidBucketName"


class InvalidArgument(S3Error):
    code = "InvalidArgument"


class InvalidS3Request(S3Error):
    code = "InvalidRequest"


class MalformedXML(S3Error):
    code = "MalformedXML"


class InvalidLocationConstraint(S3Error):
    code = "InvalidLocationConstraint"


class IllegalLocationConstraint(S3Error):
    code = "IllegalLocationConstraintException"


class InvalidTag(S3Error):
    code = "InvalidTag"


class InvalidPart(S3Error):
    code = "InvalidPart"


class InvalidPartOrder(S3Error):
    code = "InvalidPartOrder"


class S3NotImplemented(S3Error):
    code = "NotImplemented"
    status = 501


class S3MethodNotAllowed(S3Error):
    code = "MethodNotAllowed"
    status = 405


class ServiceUnavailable(HyperplanError):
    code = "ServiceUnavailable"
    status = 503


class MasterKeyUnavailable(HyperplanError):
    """The server cannot open the secrets its store keeps encrypted: it refuses to start."""

    code = "MasterKeyUnavailable"
    status = 500


class StartRefused(HyperplanError):
    """The server cannot start as configured (an isolation mode, a work directory, an interpreter); the
    message says what to change."""

    code = "StartRefused"
    status = 500


class InternalFailure(HyperplanError):
    code = "InternalFailure"
    status = 500
