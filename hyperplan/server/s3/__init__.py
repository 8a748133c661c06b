"""S3 on hyperplan's own endpoint, for the directory buckets (docs/API.md, "S3").

One entry point, :func:`hyperplan.server.s3.endpoint.serve`, an ASGI handler the router calls for every
request whose SigV4 credential scope names the service ``s3`` (and for unsigned requests that look like
S3's, answered AccessDenied). It runs outside the JSON APIs' body cap: S3 bodies are streamed to disk
under limits of their own (server/limits.py).

- ``endpoint.py``: the request's bucket and key (path-style, or ``Host: BUCKET.HOST``), authentication,
  the operation, its checks against botocore's S3 model, and the table of each operation's handler;
- ``call.py``: the request being served and what every handler asks of it (headers, query counts, the
  bucket with a right, the body, an XML body read against the operation's shape);
- ``answers.py``: S3's XML answers and headers, and an object's bytes streamed off the event loop;
- ``object_files.py``: an object as the handlers reach it (its key checked, its metadata, a body staged,
  the source of a copy, a storage failure as S3's error);
- the handlers: ``buckets.py``, ``listings.py`` (ListObjects, ListObjectsV2), ``objects.py``,
  ``multipart.py`` (uploads and their parts), ``tagging.py``;
- ``body.py``: a body received piece by piece: plain or aws-chunked, its signatures and checksums;
- the buckets' rights are services/storage/bucket_rights.py's, the files hyperplan/objects/served.py's.
"""
