"""Keep secrets out of logs, messages and summaries."""

from __future__ import annotations

import re
from collections.abc import Mapping

_SECRET_KEY = re.compile(
    r"(secret|password|passwd|token|credential|access-key|account-key|connection-string|private|session-key|sas|api-key)",
    re.I,
)
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.\-]*://[^:/@\s]*:)(?P<pw>[^@\s]+)(?P<tail>@)", re.I)

REDACTED = "***"


def is_secret_key(key: str) -> bool:
    """True for property names that hold credentials."""
    return bool(_SECRET_KEY.search(key))


def redact_text(text: str) -> str:
    """Mask passwords embedded in URLs (``postgresql://user:pw@host`` -> ``postgresql://user:***@host``)."""
    return _URL_PASSWORD.sub(lambda m: f"{m['head']}{REDACTED}{m['tail']}", text)


def redact_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``properties`` safe to print."""
    return {k: (REDACTED if is_secret_key(k) else redact_text(str(v))) for k, v in properties.items()}


def redact_secrets_in(text: str, properties: Mapping[str, str]) -> str:
    """Mask in ``text`` every value of ``properties`` that is a secret (for exception messages from libraries)."""
    out = redact_text(text)
    for k, v in properties.items():
        if v and is_secret_key(k) and len(str(v)) >= 4:
            out = out.replace(str(v), REDACTED)
    return out
