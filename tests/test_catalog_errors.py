"""A REST catalog that rejects the credentials is named with its URI in the error, on reads and on writes
(was: ``storage error on s3://…/results: UnauthorizedError``, which pointed at the bucket, not the catalog)."""

from __future__ import annotations

import uuid

import pytest

from recall_tasks.errors import StorageError
from recall_tasks.io.results import ResultStore
from recall_tasks.io.storage import StorageConfig

CATALOG = "rbdenied"


def s3_secret() -> str:
    import os

    return os.environ["AWS_SECRET_ACCESS_KEY"]


@pytest.fixture
def denied(s3_server, monkeypatch) -> tuple[ResultStore, str]:
    """An output on S3 through the REST catalog, whose requests are not signed: the bucket accepts the
    credentials, the catalog rejects its calls (401)."""
    for k, v in {**s3_server.env(), **s3_server.iceberg_catalog_env(CATALOG)}.items():
        monkeypatch.setenv(k, v)
    bucket = s3_server.make_bucket()
    monkeypatch.setenv(f"PYICEBERG_CATALOG__{CATALOG.upper()}__REST__SIGV4_ENABLED", "false")
    store = ResultStore(
        f"s3://{bucket}/out", StorageConfig.from_options(), "iceberg", CATALOG, f"t_{uuid.uuid4().hex[:12]}"
    )
    return store, s3_server.iceberg_url


def test_a_read_names_the_catalog_and_its_uri(denied: tuple[ResultStore, str]) -> None:
    store, url = denied
    with pytest.raises(StorageError) as caught:
        store.read_table("results")
    message = str(caught.value)
    assert f"Iceberg catalog {CATALOG} ({url})" in message, message
    assert "rejected the credentials" in message and "AWS_ACCESS_KEY_ID" in message, message
    assert s3_secret() not in message


def test_a_commit_names_the_catalog_and_its_uri(denied: tuple[ResultStore, str]) -> None:
    store, url = denied
    with pytest.raises(StorageError) as caught:
        store.append_comparison("c1", "d", [])
    assert f"Iceberg catalog {CATALOG} ({url})" in str(caught.value), str(caught.value)
