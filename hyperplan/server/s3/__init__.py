"""S3 on hyperplan's own endpoint, for the directory buckets (docs/API.md, "S3").

One entry point, :func:`hyperplan.server.s3.endpoint.serve`, an ASGI handler the router calls for every
request whose SigV4 credential scope names the service ``s3`` (and for unsigned requests that look like
S3's, answered AccessDenied). It runs outside the JSON APIs' body cap: S3 bodies are streamed to disk
under limits of their own (server/limits.py).

- ``endpoint.py``: the request's bucket and key (path-style, or ``Host: BUCKET.HOST``), authentication,
  the operation, its checks against botocore's S3 model, the handlers, S3's XML answers;
- ``body.py``: a body received piece by piece: plain or aws-chunked, its signatures and checksums;
- the buckets' rights are services/storage/bucket_rights.py's, the files hyperplan/objects/served.py's.
"""
