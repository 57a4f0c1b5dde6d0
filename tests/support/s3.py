"""A real S3-compatible server for the tests: moto's server (``moto[server]``) on 127.0.0.1, a free port.

Not a mock of any lakesink code: pyiceberg's PyArrow FileIO (Arrow's C++ S3 client) and its fsspec
FileIO (s3fs, botocore) talk HTTP to it as they would to AWS S3 or MinIO. moto >= 5.2.5: older
versions break pyarrow's multipart uploads.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any

ACCESS_KEY = "lakesink-test-key"
# not a real credential; the tests check that it never appears in logs or error messages
SECRET_KEY = "lakesink-test-SECRET-0f9e8d7c"
REGION = "us-east-1"

#: pyiceberg's two FileIO implementations that reach S3
FILE_IO = {
    "pyarrow": "pyiceberg.io.pyarrow.PyArrowFileIO",
    "fsspec": "pyiceberg.io.fsspec.FsspecFileIO",
}


@dataclass
class S3Server:
    server: Any
    endpoint: str
    _counter: itertools.count[int] = field(default_factory=itertools.count)

    @classmethod
    def start(cls) -> S3Server:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per HTTP request
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        return cls(server=server, endpoint=f"http://{host}:{port}")

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def create_bucket(self) -> str:
        # moto's backend is global to the process: every server started in one test run serves the same
        # buckets, so a name must be unique across servers, not just across this one's counter
        name = f"lakesink-{next(self._counter)}-{uuid.uuid4().hex[:8]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> set[str]:
        """Every object key under ``prefix`` in ``bucket``."""
        out: set[str] = set()
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out.update(o["Key"] for o in page.get("Contents", []))
        return out

    def properties(self, io: str = "pyarrow") -> dict[str, str]:
        """pyiceberg catalog properties that reach this server through FileIO ``io`` (``pyarrow`` or ``fsspec``)."""
        return {
            "py-io-impl": FILE_IO[io],
            "s3.endpoint": self.endpoint,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "s3.region": REGION,
            # moto serves buckets by path (http://127.0.0.1:port/bucket/key)
            "s3.force-virtual-addressing": "false",
        }

    def stop(self) -> None:
        self.server.stop()
