"""The test S3 server (tests/s3_server.py) takes a bucket per test for a whole session: it must not run out of
volume slots. Each bucket is a SeaweedFS collection with a volume of its own; weed's default slot count comes from
the disk's free space (69 on the development machine), and past it every new bucket's first write failed with
"InternalError"."""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.request
from pathlib import Path

import pytest

from tests.s3_server import VOLUME_MAX, start_server

BUCKETS = 90  # more than the default slots seen here, so the write below fails without VOLUME_MAX


@pytest.mark.concurrency
def test_a_fresh_server_takes_more_buckets_than_its_disk_derived_volume_slots():
    data_dir = Path(tempfile.mkdtemp(prefix="rb-weed-volumes-"))
    server = start_server(data_dir)
    try:
        status = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{server.ports['master']}/dir/status").read())
        assert status["Topology"]["Max"] >= VOLUME_MAX, status["Topology"]
        client = server.client()
        for i in range(BUCKETS):
            bucket = server.make_bucket()
            client.put_object(Bucket=bucket, Key="k", Body=f"object {i}".encode())
            assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == f"object {i}".encode()
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
