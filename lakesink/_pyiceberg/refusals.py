"""Refusal classification: whether a catalog's error is its definite "no" (the request was evaluated and not
applied) and whether that "no" is a permission refusal (a REST 401/403, AWS's ``AccessDenied*``). Driver side.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyiceberg.exceptions import BadRequestError, ForbiddenError, NoSuchTableError, UnauthorizedError


def refused_by_the_catalog(error: BaseException) -> bool:
    """Whether a commit's error is the catalog's definite "no" (the request was evaluated and not applied): a REST
    answer 4xx other than 408 (timeout) and 429 (throttled), which pyiceberg raises chained to the HTTP error
    (``BadRequestError``, ``ForbiddenError``, a ``RESTError`` for 422, ...). Anything else (5xx, a timeout, a reset
    connection) leaves the outcome unknown, and on a catalog reached over HTTP the request may still land later."""
    if refused_for_permission(error) is not None:
        return True  # also AWS's AccessDenied* (Glue), a botocore ClientError of its own
    cause = error.__cause__
    response = getattr(cause, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(status, int):
        return 400 <= status < 500 and status not in (408, 429)
    return isinstance(error, (BadRequestError, UnauthorizedError, ForbiddenError, NoSuchTableError))


#: AWS's error codes for a request its credentials may not make (botocore ``ClientError``, e.g. Glue's UpdateTable)
_AWS_ACCESS_DENIED = ("AccessDeniedException", "AccessDenied", "UnauthorizedOperation")


def refused_for_permission(error: BaseException) -> str | None:
    """The catalog's refusal when a commit's error is a permission refusal, else None: a REST answer 403
    (``ForbiddenError``), or 401 still there after pyiceberg refreshed its token and sent the request again
    (``UnauthorizedError``), or AWS's ``AccessDenied*`` (Glue). Sending the same commit again with the same
    credentials cannot help: the caller fails fast instead of retrying."""
    cause = error.__cause__
    status = getattr(getattr(cause, "response", None), "status_code", None)
    if status in (401, 403) or (status is None and isinstance(error, (UnauthorizedError, ForbiddenError))):
        return f"HTTP {status or (403 if isinstance(error, ForbiddenError) else 401)}: {error}"
    aws = getattr(error, "response", None)
    if isinstance(aws, Mapping):
        code = str((aws.get("Error") or {}).get("Code") or "")
        http = (aws.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        if code in _AWS_ACCESS_DENIED or http == 403:
            return f"{code or 'HTTP 403'}: {error}"
    return None
