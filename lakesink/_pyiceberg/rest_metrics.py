"""Iceberg REST metrics reports: ``POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/metrics``. Driver side.

Iceberg's Java REST client sends a ``ReportMetricsRequest`` (a ``commit-report`` after every commit) to this endpoint
of its catalog server (``RESTSessionCatalog``, catalog property ``rest-metrics-reporting-enabled``, default true);
pyiceberg 0.12 sends none. This seam sends one through the catalog's own HTTP session (its auth manager, headers and
SigV4 signing) with a short timeout of its own: a report never holds a commit back for long, and never fails it.

It is sent only to a server that lists the endpoint in ``/v1/config`` (pyiceberg keeps the list it read when it made
the catalog: no request here): a server without a list gets pyiceberg's default endpoints, which do not include it
(as with ``transactions/commit``, lakesink does not assume a route that servers omitting the list may lack).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pyiceberg.catalog.rest import Endpoint, HttpMethod, RestCatalog

log = logging.getLogger("lakesink")

#: the REST spec's metrics endpoint (apache/iceberg open-api/rest-catalog-open-api.yaml, ``reportMetrics``)
REPORT_METRICS_ENDPOINT = Endpoint(http_method=HttpMethod.POST, path="/v1/{prefix}/namespaces/{namespace}/tables/{table}/metrics")
#: Iceberg Java's catalog property that switches the reports off (``RESTSessionCatalog.REST_METRICS_REPORTING_ENABLED``)
REPORTING_ENABLED = "rest-metrics-reporting-enabled"
#: seconds a report may take (connect and read): a slow metrics endpoint costs a commit at most this much
REPORT_TIMEOUT_S = 2.0


def reports_metrics(catalog: Any) -> bool:
    """Whether commits on ``catalog`` are reported to it: a REST catalog whose server lists the metrics endpoint,
    unless its property ``rest-metrics-reporting-enabled`` is ``false`` (Iceberg Java's switch)."""
    if not isinstance(catalog, RestCatalog):
        return False
    if str(catalog.properties.get(REPORTING_ENABLED, "true")).strip().lower() == "false":
        return False
    endpoints = getattr(catalog, "_supported_endpoints", None)
    return bool(endpoints) and REPORT_METRICS_ENDPOINT in endpoints  # type: ignore[operator]


def post_report(catalog: Any, identifier: tuple[str, ...], report: Mapping[str, Any]) -> None:
    """Send ``report`` (a ``ReportMetricsRequest`` as JSON) for table ``identifier``. Raises on a failed request (the
    caller logs it); ``requests``' own timeout bounds it to :data:`REPORT_TIMEOUT_S` per connect and per read."""
    assert isinstance(catalog, RestCatalog)
    url = catalog.url(
        "namespaces/{namespace}/tables/{table}/metrics", prefixed=True, **catalog._split_identifier_for_path(identifier)
    )
    response = catalog._session.post(url, json=dict(report), timeout=REPORT_TIMEOUT_S)
    response.raise_for_status()
