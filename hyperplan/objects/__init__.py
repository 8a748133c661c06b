"""Objects named by ``s3://BUCKET/KEY`` URIs, kept wherever the fleet file says.

SageMaker URIs stay ``s3://`` on the wire. Behind them, each bucket is kept by a store
(:class:`~hyperplan.objects.base.BucketStore`):

* a bucket the fleet file's ``[buckets]`` maps to a directory lives there, and the directory must exist;
* a bucket it maps to an S3-compatible endpoint lives there (:class:`~hyperplan.objects.s3.S3Store`,
  through boto3), as the remote bucket it names; that bucket must exist, hyperplan never creates one;
* any other bucket lives in ``DEFAULT_ROOT/BUCKET`` (``DATA_DIR/s3/BUCKET``, on a filesystem the nodes
  share); it is created by the first write and is "no such bucket" to reads until then.

A key is a path under its bucket: ``/`` separates directories, and "prefixes" are whole directories
(``s3://b/data/train`` covers ``data/train/...``, never ``data/training.csv``), which is what SageMaker's
``S3Prefix`` channels and checkpoint locations mean in practice. Bucket names follow S3's rules and keys
with ``.`` or ``..`` segments, empty segments, NUL bytes or encoded dots and slashes are refused
(hyperplan/core/buckets.py), so a URI can never name a file outside its bucket; and no symbolic link is
followed out of a bucket's directory, nor out of a local directory being uploaded or downloaded into
(paths are checked once resolved).

Every write is atomic per file (a hidden temporary file in the same directory, then a rename; on S3, a PUT
or a completed multipart upload), so a reader sees either the old object or the new one, never half of
one. Every failure is a :class:`StorageError` whose message starts with the URI (the ``s3://`` URI the job
named, not the remote bucket's), ready to become a job's FailureReason or a node's message.

Every transfer the server makes for an account goes through ``Storage.for_account(guard)``: before each
read (listing, download) and each write (upload) of a bucket, the guard (the account's rights, from
hyperplan/services/storage/bucket_rights.py) allows it, claims a free bucket for a write, or refuses with a
:class:`~hyperplan.objects.uris.BucketAccessError` whose message starts with the URI.

The modules: `uris` (the URI rules and the one error, StorageError), `base` (what a bucket's store does),
`directory` and `s3` (the two stores), `storage` (the fleet's buckets, each on its store).
"""
