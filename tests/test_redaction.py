"""lakesink.redaction: secrets never reach logs, messages or reprs."""

from __future__ import annotations

import pytest

from lakesink.redaction import REDACTED, is_secret_key, redact_properties, redact_secrets_in, redact_text

# Credential-holding property names of pyiceberg 0.12 (pyiceberg.io, pyiceberg.catalog.*) and common ones.
SECRET_KEYS = [
    "s3.secret-access-key",
    "client.secret-access-key",
    "glue.secret-access-key",
    "dynamodb.secret-access-key",
    "s3.session-token",
    "client.session-token",
    "adls.sas-token",
    "adls.client-secret",
    "adls.credential",
    "adls.token",
    "adls.account-key",
    "adls.connection-string",
    "gcs.oauth2.token",
    "hf.token",
    "token",
    "credential",
    "password",
    "db.PASSWORD",
    "jdbc.passwd",
    "rest.api-key",
]

PLAIN_KEYS = ["type", "uri", "warehouse", "s3.endpoint", "s3.region", "adls.account-name", "py-io-impl", "name"]


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_secret_keys_are_recognised(key: str) -> None:
    assert is_secret_key(key) is True


@pytest.mark.parametrize("key", PLAIN_KEYS)
def test_plain_keys_are_not_secret(key: str) -> None:
    assert is_secret_key(key) is False


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgresql://lake:s3cr3t@db:5432/iceberg", "postgresql://lake:***@db:5432/iceberg"),
        ("postgresql+psycopg2://lake:s3cr3t@db/iceberg", "postgresql+psycopg2://lake:***@db/iceberg"),
        ("mysql://root:pa:ss@host/db", "mysql://root:***@host/db"),
        (
            "cannot connect to postgresql://a:pw1@h1/x, then to https://b:pw2@h2:8181/v1 either",
            "cannot connect to postgresql://a:***@h1/x, then to https://b:***@h2:8181/v1 either",
        ),
        ("redis://:s3cr3tpw@cache:6379/0", "redis://:***@cache:6379/0"),
        ("postgresql://:s3cr3tpw@db/iceberg", "postgresql://:***@db/iceberg"),
    ],
)
def test_redact_text_masks_url_passwords(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "sqlite:////tmp/lakehouse/catalog.db",
        "http://rest-catalog:8181/v1/config",
        "file:///tmp/lakehouse/warehouse",
        "postgresql://lake@db:5432/iceberg",
        "no url at all: user:pw",
    ],
)
def test_redact_text_leaves_urls_without_password_alone(text: str) -> None:
    assert redact_text(text) == text


def test_redact_properties() -> None:
    props = {
        "type": "sql",
        "uri": "postgresql://lake:s3cr3t@db/iceberg",
        "s3.secret-access-key": "wJalrXUtnFEMI",
        "s3.endpoint": "http://minio:9000",
        "token": "",
    }
    assert redact_properties(props) == {
        "type": "sql",
        "uri": "postgresql://lake:***@db/iceberg",
        "s3.secret-access-key": REDACTED,
        "s3.endpoint": "http://minio:9000",
        "token": REDACTED,
    }
    assert props["s3.secret-access-key"] == "wJalrXUtnFEMI"  # a copy: the input is unchanged


def test_redact_secrets_in_masks_secret_values_anywhere_in_a_message() -> None:
    props = {
        "s3.secret-access-key": "wJalrXUtnFEMI",
        "credential": "client:cl1ent-s3cret",
        "warehouse": "s3://bucket/wh",
        "uri": "http://rest:8181",
    }
    message = (
        "InvalidAccessKeyId: key wJalrXUtnFEMI refused for s3://bucket/wh; "
        "oauth with client:cl1ent-s3cret failed at postgresql://u:dbpw@db/x"
    )
    assert redact_secrets_in(message, props) == (
        "InvalidAccessKeyId: key *** refused for s3://bucket/wh; oauth with *** failed at postgresql://u:***@db/x"
    )


def test_redact_secrets_in_ignores_short_and_empty_secret_values() -> None:
    # masking a 1-3 character value would mangle unrelated text; such values are not masked
    props = {"token": "ab", "password": ""}
    assert redact_secrets_in("table ab not found", props) == "table ab not found"
