"""recall_tasks.io.storage and recall_tasks.secrets, against a real S3 server (SeaweedFS, see s3_server.py)."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from botocore.exceptions import ClientError
from deltalake import DeltaTable, write_deltalake

from recall_tasks.errors import ConfigError, StorageError
from recall_tasks.io.storage import (
    StorageConfig,
    delta_storage_options,
    filesystem,
    join_uri,
    parse_storage_options,
    split_uri,
    storage_errors,
    translate_storage_error,
)
from recall_tasks.secrets import redact, redact_mapping, register_secret
from tests import s3_server as _s3

# Register the fixtures for this module (the project's conftest may also import them).
s3_server = _s3.s3_server
s3_bucket = _s3.s3_bucket

TABLE = pa.table({"id": [1, 2, 3], "text": ["a", "b", "c"]})


def _config(server: _s3.S3Server, **overrides: str) -> StorageConfig:
    return StorageConfig.from_options({**server.storage_options(), **overrides}, env={})


def _delta_log(server: _s3.S3Server, bucket: str, table: str) -> list[str]:
    listing = server.client().list_objects_v2(Bucket=bucket, Prefix=f"{table}/_delta_log/")
    return sorted(o["Key"].rsplit("/", 1)[1] for o in listing.get("Contents", []))


# ------------------------------------------------------------------------------------ real server: data


def test_parquet_roundtrip_through_filesystem(s3_server: _s3.S3Server, s3_bucket: str) -> None:
    config = _config(s3_server)
    uri = join_uri(f"s3://{s3_bucket}/runs", "2024", "cases.parquet")
    fs, path = filesystem(uri, config)
    assert path == f"{s3_bucket}/runs/2024/cases.parquet"
    pq.write_table(TABLE, path, filesystem=fs)
    assert pq.read_table(path, filesystem=fs).equals(TABLE)
    assert fs.exists(path)


def test_delta_write_read_and_two_appends_make_two_versions(s3_server: _s3.S3Server, s3_bucket: str) -> None:
    uri = f"s3://{s3_bucket}/t"
    options = delta_storage_options(uri, _config(s3_server))
    write_deltalake(uri, TABLE, storage_options=options)
    assert DeltaTable(uri, storage_options=options).to_pyarrow_table().sort_by("id").equals(TABLE)

    write_deltalake(uri, TABLE, mode="append", storage_options=options)
    dt = DeltaTable(uri, storage_options=options)
    assert dt.version() == 1
    assert len(dt.history()) == 2
    assert dt.to_pyarrow_table().num_rows == 6
    assert _delta_log(s3_server, s3_bucket, "t") == [f"{v:020d}.json" for v in (0, 1)]


@pytest.mark.concurrency
def test_concurrent_delta_writers_lose_nothing(s3_server: _s3.S3Server, s3_bucket: str) -> None:
    """3 threads x 3 appends racing on one table: deltalake commits with ``If-None-Match: *``; SeaweedFS
    answers 412 to the losers, which retry at the next version. No commit is lost or overwritten."""
    uri = f"s3://{s3_bucket}/t"
    options = delta_storage_options(uri, _config(s3_server))
    write_deltalake(uri, pa.table({"writer": [-1], "n": [-1]}), storage_options=options)
    start = threading.Barrier(3)
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        start.wait()
        for n in range(3):
            try:
                write_deltalake(
                    uri, pa.table({"writer": [w] * 5, "n": [n] * 5}), mode="append", storage_options=options
                )
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    dt = DeltaTable(uri, storage_options=options)
    assert dt.version() == 9
    assert _delta_log(s3_server, s3_bucket, "t") == [f"{v:020d}.json" for v in range(10)]
    rows = dt.to_pyarrow_table().to_pylist()
    assert len(rows) == 1 + 3 * 3 * 5
    pairs = {(r["writer"], r["n"]) for r in rows if r["writer"] >= 0}
    assert pairs == {(w, n) for w in range(3) for n in range(3)}


def test_server_enforces_conditional_put(s3_server: _s3.S3Server, s3_bucket: str) -> None:
    """What makes the concurrent commits above safe: a second create of the same key is refused."""
    client = s3_server.client()
    client.put_object(Bucket=s3_bucket, Key="_delta_log/0.json", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as info:
        client.put_object(Bucket=s3_bucket, Key="_delta_log/0.json", Body=b"second", IfNoneMatch="*")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert client.get_object(Bucket=s3_bucket, Key="_delta_log/0.json")["Body"].read() == b"first"


def test_delta_commits_need_conditional_put(s3_server: _s3.S3Server, s3_bucket: str) -> None:
    """Explicit pass-through options win; with conditional put disabled deltalake 1.x cannot commit."""
    uri = f"s3://{s3_bucket}/t"
    options = delta_storage_options(uri, _config(s3_server, AWS_CONDITIONAL_PUT="disabled"))
    assert options is not None and options["AWS_CONDITIONAL_PUT"] == "disabled"
    with pytest.raises(OSError, match="conditional put is disabled"):
        write_deltalake(uri, TABLE, storage_options=options)


@pytest.mark.concurrency
def test_server_restart_keeps_data(s3_server: _s3.S3Server, s3_bucket: str) -> None:
    fs, path = filesystem(f"s3://{s3_bucket}/x.parquet", _config(s3_server))
    pq.write_table(TABLE, path, filesystem=fs)
    port = s3_server.ports["s3"]
    s3_server.restart()
    assert s3_server.ports["s3"] == port
    assert pq.read_table(path, filesystem=fs).equals(TABLE)


# ---------------------------------------------------------------------------------- real server: errors


def test_missing_object_is_object_not_found(s3_server: _s3.S3Server, s3_bucket: str) -> None:
    config = _config(s3_server)
    uri = f"s3://{s3_bucket}/nope/cases.parquet"
    fs, path = filesystem(uri, config)
    with pytest.raises(StorageError, match=f"^object not found: {uri}$"), storage_errors(uri, config, fs):
        pq.read_table(path, filesystem=fs)
    table_uri = f"s3://{s3_bucket}/no-table"
    with (
        pytest.raises(StorageError, match=f"^object not found: {table_uri}"),
        storage_errors(table_uri, config),
    ):
        DeltaTable(table_uri, storage_options=delta_storage_options(table_uri, config))


def test_missing_bucket(s3_server: _s3.S3Server) -> None:
    config = _config(s3_server)
    uri = "s3://rb-no-such-bucket/x.parquet"
    fs, path = filesystem(uri, config)
    missing = "^bucket does not exist: s3://rb-no-such-bucket "
    with pytest.raises(StorageError, match=missing), storage_errors(uri, config, fs):
        pq.read_table(path, filesystem=fs)
    with pytest.raises(StorageError, match=missing), storage_errors(uri, config, fs):
        pq.write_table(TABLE, path, filesystem=fs)
    delta_uri = "s3://rb-no-such-bucket/t"
    with pytest.raises(StorageError, match="^bucket does not exist"), storage_errors(delta_uri, config):
        write_deltalake(delta_uri, TABLE, storage_options=delta_storage_options(delta_uri, config))


def test_wrong_secret_is_access_denied_without_secrets(s3_server: _s3.S3Server, s3_bucket: str) -> None:
    wrong = "wrong-secret-" + os.urandom(6).hex()
    config = _config(s3_server, aws_secret_access_key=wrong)
    uri = f"s3://{s3_bucket}/x.parquet"
    fs, path = filesystem(uri, config)
    delta_uri = f"s3://{s3_bucket}/t"
    attempts = [
        lambda: pq.write_table(TABLE, path, filesystem=fs),
        lambda: pq.read_table(path, filesystem=fs),
        lambda: write_deltalake(delta_uri, TABLE, storage_options=delta_storage_options(delta_uri, config)),
    ]
    for attempt in attempts:
        with pytest.raises(StorageError) as info, storage_errors(uri, config, fs):
            attempt()
        message = str(info.value)
        assert message.startswith("access denied (check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or --storage-option)")
        assert wrong not in message and s3_server.secret_key not in message


def test_unreachable_endpoint_fails_fast(s3_server: _s3.S3Server) -> None:
    endpoint = f"http://127.0.0.1:{_s3.closed_port()}"
    config = _config(s3_server, aws_endpoint_url=endpoint, connect_timeout="2", max_attempts="1")
    assert config.s3fs_options()["config_kwargs"] == {"connect_timeout": 2.0, "retries": {"max_attempts": 1}}
    uri = "s3://bucket/x.parquet"
    fs, path = filesystem(uri, config)
    for attempt in (
        lambda: pq.read_table(path, filesystem=fs),
        lambda: write_deltalake("s3://bucket/t", TABLE, storage_options=delta_storage_options(uri, config)),
    ):
        t0 = time.monotonic()
        with (
            pytest.raises(StorageError, match=f"^cannot reach endpoint {endpoint}: "),
            storage_errors(uri, config),
        ):
            attempt()
        assert time.monotonic() - t0 < 6


def test_translate_local_generic_and_redacted_errors() -> None:
    err = translate_storage_error(ValueError("boom"), "s3://b/k")
    assert str(err) == "storage error on s3://b/k: ValueError: boom"
    assert str(translate_storage_error(FileNotFoundError(2, "nope"), "/d/x")) == "object not found: /d/x"
    denied = str(translate_storage_error(PermissionError(13, "Permission denied"), "/d/x"))
    assert denied.startswith("access denied (check file permissions): /d/x")
    dns = translate_storage_error(socket.gaierror(-2, "Name or service not known"), "s3://b/k")
    assert str(dns).startswith("cannot reach endpoint (default AWS endpoint): ")
    secret = "leaky-secret-" + os.urandom(4).hex()
    config = StorageConfig.from_options({"aws_secret_access_key": secret}, env={})
    leaked = translate_storage_error(OSError(f"signature for {secret} rejected"), "s3://b/k", config=config)
    assert secret not in str(leaked) and "signature for *** rejected" in str(leaked)
    with pytest.raises(KeyError), storage_errors("s3://b/k"):
        raise KeyError("not a storage error: propagates unchanged")


# -------------------------------------------------------------------------------------- configuration


def test_parse_storage_options() -> None:
    assert parse_storage_options(["aws_region=eu-west-1", " endpoint_url =http://h:1/?a=b", "k=v", "k=w"]) == {
        "aws_region": "eu-west-1",
        "endpoint_url": "http://h:1/?a=b",
        "k": "w",
    }
    assert parse_storage_options([]) == {}
    with pytest.raises(ConfigError, match=r"#2 <10 chars hidden>: expected key=value \(there is no '='\)"):
        parse_storage_options(["a=b", "aws_region"])
    with pytest.raises(ConfigError) as info:  # a malformed pair is never echoed, even when it looks like a name
        parse_storage_options(["sk-abcdefgh"])
    assert "sk-abcdefgh" not in str(info.value)
    with pytest.raises(ConfigError, match=r"#1 <12 chars hidden>: expected key=value \(the key is empty\)"):
        parse_storage_options(["=hunter2pass"])
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    with pytest.raises(ConfigError) as info:
        parse_storage_options([secret])
    assert secret not in str(info.value) and "40 chars hidden" in str(info.value)


def test_env_vars_picked_up(s3_server: _s3.S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    config = StorageConfig.from_options(None)
    assert config.endpoint_url == s3_server.endpoint_url and config.allow_http is True
    assert config.secret_access_key is not None and config.secret_access_key.get_secret_value() == s3_server.secret_key
    fs, path = filesystem(f"s3://{s3_bucket}/env.parquet")  # config from the environment
    pq.write_table(TABLE, path, filesystem=fs)
    assert pq.read_table(path, filesystem=fs).equals(TABLE)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://s3-specific:9000")
    assert StorageConfig.from_options(None).endpoint_url == "http://s3-specific:9000"


def test_explicit_options_win_over_env() -> None:
    env = {"AWS_ENDPOINT_URL": "http://env:1", "AWS_REGION": "env-region", "AWS_SESSION_TOKEN": "env-token"}
    config = StorageConfig.from_options({"endpoint_url": "http://cli:2", "AWS_SESSION_TOKEN": ""}, env=env)
    assert (config.endpoint_url, config.region, config.session_token) == ("http://cli:2", "env-region", None)
    env = {"AWS_DEFAULT_REGION": "default-region"}
    assert StorageConfig.from_options(None, env=env).region == "default-region"
    assert StorageConfig.from_options(None, env={**env, "AWS_REGION": "r"}).region == "r"


def test_s3fs_style_options() -> None:
    config = StorageConfig.from_options(
        {
            "key": "AKIAEXAMPLE",
            "secret": "s3fs-style-secret",
            "client_kwargs": '{"endpoint_url": "https://s3.example:9000", "region_name": "eu-west-3"}',
            "config_kwargs": {"connect_timeout": 3, "read_timeout": 9, "retries": {"max_attempts": 2}},
            "anon": "false",
        },
        env={},
    )
    kwargs = config.s3fs_options()
    assert kwargs["key"] == "AKIAEXAMPLE" and kwargs["secret"] == "s3fs-style-secret"
    assert kwargs["endpoint_url"] == "https://s3.example:9000"
    assert kwargs["client_kwargs"] == {"region_name": "eu-west-3"} and kwargs["use_listings_cache"] is False
    assert kwargs["config_kwargs"] == {
        "connect_timeout": 3,
        "read_timeout": 9,
        "retries": {"max_attempts": 2},
    }
    assert config.plain_extra() == {"anon": "false"}
    with pytest.raises(ConfigError, match="'client_kwargs' must be a JSON object"):
        StorageConfig.from_options({"client_kwargs": "not json"}, env={})
    with pytest.raises(ConfigError, match="max_attempts") as info:
        StorageConfig.from_options({"max_attempts": "zero", "secret": "do-not-echo"}, env={})
    assert "do-not-echo" not in str(info.value) and "zero" not in str(info.value)


def test_delta_storage_options_shape(tmp_path: Path) -> None:
    config = StorageConfig.from_options(
        {"aws_access_key_id": "AKIA1", "aws_secret_access_key": "sek-ret", "endpoint": "http://127.0.0.1:9"},
        env={},
    )
    assert delta_storage_options(str(tmp_path), config) is None
    assert delta_storage_options(f"file://{tmp_path}", config) is None
    assert delta_storage_options("s3://b/t", config) == {
        "AWS_ACCESS_KEY_ID": "AKIA1",
        "AWS_SECRET_ACCESS_KEY": "sek-ret",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
        "AWS_CONDITIONAL_PUT": "etag",
    }
    https = StorageConfig.from_options({"endpoint": "https://s3.example", "region": "eu-west-1"}, env={})
    opts = delta_storage_options("s3a://b/t", https)
    assert opts == {
        "AWS_ENDPOINT_URL": "https://s3.example",
        "AWS_REGION": "eu-west-1",
        "AWS_CONDITIONAL_PUT": "etag",
    }
    timeouts = StorageConfig.from_options({"connect_timeout": "2.5", "timeout": "30", "max_attempts": "1"}, env={})
    opts = delta_storage_options("s3://b/t", timeouts) or {}
    assert (opts["connect_timeout"], opts["timeout"], opts["max_retries"]) == ("2500ms", "30000ms", "0")
    assert delta_storage_options("az://c/t", StorageConfig.from_options({"account_name": "acct"}, env={})) == {
        "account_name": "acct"
    }


def test_filesystem_local_and_other_protocols(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    fs, path = filesystem("out/cases.parquet", StorageConfig())
    assert path == os.path.join(str(tmp_path), "out", "cases.parquet") and fs.protocol[0] == "file"
    fs.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(TABLE, path, filesystem=fs)
    _, file_path = filesystem(f"file://{path}", StorageConfig())
    assert file_path == path and pq.read_table(file_path, filesystem=fs).equals(TABLE)
    mem, mem_path = filesystem("memory://bucket/x.parquet", StorageConfig())
    pq.write_table(TABLE, mem_path, filesystem=mem)
    assert mem_path == "/bucket/x.parquet" and pq.read_table(mem_path, filesystem=mem).equals(TABLE)
    assert split_uri("S3://b/k") == ("s3", "b/k")


def test_join_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert join_uri("s3://b/x", "results") == "s3://b/x/results"
    assert join_uri("s3://b/x/", "/results/", "run-1/") == "s3://b/x/results/run-1"
    assert join_uri("gs://b", "a", "", "b.parquet") == "gs://b/a/b.parquet"
    assert join_uri("file:///data/x", "r") == "file:///data/x/r"
    monkeypatch.chdir(tmp_path)
    assert join_uri("out", "results") == os.path.join(str(tmp_path), "out", "results")
    assert join_uri("/abs/x", "results") == "/abs/x/results"


# ----------------------------------------------------------------------------------------------- secrets


def test_redact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-1234")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-5678")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "abc")  # too short to be a secret: left alone
    register_secret("registered-" + "9" * 8)
    register_secret(None)
    text = "key sk-openai-1234 / aws-secret-5678 / registered-99999999 / extra-value / abc"
    assert redact(text, extra=["extra-value", "", "x"]) == "key *** / *** / *** / *** / abc"
    assert redact("nothing to hide") == "nothing to hide"
    assert redact_mapping(
        {"aws_secret_access_key": "s", "Api-Key": "k", "SessionToken": "t", "password": "p", "region": "r",
         "client_kwargs": {"aws_access_key_id": "a", "endpoint_url": "e"}, "credentials_file": "c"}
    ) == {"aws_secret_access_key": "***", "Api-Key": "***", "SessionToken": "***", "password": "***",
          "region": "r", "client_kwargs": {"aws_access_key_id": "***", "endpoint_url": "e"},
          "credentials_file": "***"}  # fmt: skip


def test_config_repr_and_dump_hide_secrets() -> None:
    secret, token, key = "cfg-secret-" + os.urandom(4).hex(), "cfg-token-" + os.urandom(4).hex(), "AKIACFG1"
    config = StorageConfig.from_options(
        {"aws_access_key_id": key, "aws_secret_access_key": secret, "aws_session_token": token,
         "account_key": "azure-account-key-1", "endpoint": "http://h:1"},
        env={},
    )  # fmt: skip
    for shown in (repr(config), str(config), str(config.model_dump()), config.model_dump_json()):
        for value in (secret, token, key, "azure-account-key-1"):
            assert value not in shown
    assert "http://h:1" in repr(config)
    # Values given to StorageConfig are registered: any later message is redacted.
    assert redact(f"failed with {secret} and {token}") == "failed with *** and ***"
    assert config.secrets() == [key, secret, token, "azure-account-key-1"]
