"""The one place lakesink relies on pyspark internals (not its public API).

Like :mod:`lakesink._pyiceberg` for pyiceberg: every use of a private pyspark name, of the JVM
objects behind a Python object (``_jsq``, ``_jvm``, ``_jsparkSession``, ``_jdf``) or of pyspark's
own module layout lives here, so that a pyspark upgrade is checked in one file (and in
``tests/seam/test_contract.py``, which pins each of them). Each function says the pyspark version it
was checked on and what it relies on.

This module imports nothing from lakesink and only the pyspark modules the data source writer
already needs, so both the executor side and the driver side may use it.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema as _to_arrow_schema
from pyspark.sql.types import StructType

if TYPE_CHECKING:
    import pyarrow as pa

STREAMING_SINK_RUNNER = "pyspark.sql.worker.python_streaming_sink_runner"
"""The module of the Python worker in which Spark commits or aborts a streaming data source write."""


def in_streaming_sink_runner() -> bool:
    """Whether this call comes from Spark's streaming sink runner (a commit or abort of a Python data source).

    Checked on pyspark 4.1.0 and 4.3.0. Relies on: Spark re-creating the data source writer with
    ``DataSource.streamWriter()`` from ``pyspark.sql.worker.python_streaming_sink_runner`` (``_main`` on
    4.3, ``main`` on 4.1) for
    every commit and abort (no argument or flag tells the writer why it is made), so the call stack
    is the only sign; on ``sys._getframe`` (CPython) and on that module keeping its name.
    """
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == STREAMING_SINK_RUNNER:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def arrow_schema(schema: StructType, *, error_on_duplicated_field_names_in_struct: bool = False) -> pa.Schema:
    """The Arrow schema Spark gives a Spark schema, with zoned timestamps as ``timestamp[us, tz=UTC]``.

    Checked on pyspark 4.1.0 and 4.3.0. Relies on ``pyspark.sql.pandas.types.to_arrow_schema``, whose
    keywords changed between them: 4.1 has ``timestamp_utc`` (True: zoned timestamps in UTC), 4.3 has
    a keyword-only ``timezone`` (and no ``timestamp_utc``). Calling 4.3's keyword on 4.1 raised a
    ``TypeError`` for every batch. pyspark's own verdicts on a schema (an unsupported type, duplicated
    struct field names) are ``PySparkException``s; anything else is raised as it is.
    """
    params = inspect.signature(_to_arrow_schema).parameters
    duplicates = error_on_duplicated_field_names_in_struct
    if "timezone" in params:
        return _to_arrow_schema(schema, timezone="UTC", error_on_duplicated_field_names_in_struct=duplicates)
    if "timestamp_utc" in params:
        return _to_arrow_schema(schema, timestamp_utc=True, error_on_duplicated_field_names_in_struct=duplicates)  # type: ignore[call-arg]
    raise RuntimeError(  # an internal error, on purpose not a lakesink error class: pyspark changed under lakesink
        f"pyspark {_pyspark_version()}: pyspark.sql.pandas.types.to_arrow_schema{inspect.signature(_to_arrow_schema)} "
        "takes neither 'timezone' (pyspark 4.2+) nor 'timestamp_utc' (pyspark 4.1): this pyspark version is not "
        "supported by this lakesink (see pyproject.toml for the range it is tested on)"
    )


def local_worker_python(spark: SparkSession) -> str | None:
    """The interpreter Spark starts the session's Python workers with (data source writers, ``mapInArrow``), when they
    run on this machine (a ``local`` master); None otherwise (a cluster's executors, a Spark Connect session).

    Checked on pyspark 4.1.0 and 4.3.0. Relies on: ``SparkContext.pythonExec`` (set from ``PYSPARK_PYTHON`` when the
    context is made, default ``python3``), which pyspark gives every Python function and data source it registers.
    """
    try:
        context = spark.sparkContext
    except Exception:  # Spark Connect: no SparkContext in the client
        return None
    if not str(context.master).startswith("local"):
        return None
    python = getattr(context, "pythonExec", None)
    return python if isinstance(python, str) else None


def _pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def _running_query(spark: SparkSession, query_id: str) -> tuple[SparkSession, Any] | None:
    """The session that runs the streaming query ``query_id`` and the query's JVM ``StreamExecution``."""
    # foreachBatch hands over a clone of the session; the query is registered with the session that
    # started it, usually the active or the first session of this process.
    candidates = [spark, SparkSession.getActiveSession(), getattr(SparkSession, "_instantiatedSession", None)]
    for session in candidates:
        if session is None:
            continue
        try:
            query = session.streams.get(query_id)
            if query is not None:
                return session, query._jsq.streamingQuery()
        except Exception:
            continue
    return None


def running_query_checkpoint(spark: SparkSession, query_id: str) -> str | None:
    """The resolved checkpoint root of the running streaming query ``query_id`` (classic Spark, not Connect).

    Checked on pyspark 4.3.0. Relies on: ``StreamingQuery._jsq`` (the JVM ``StreamingQueryWrapper``),
    its ``streamingQuery()`` (the JVM ``StreamExecution``) and that object's
    ``resolvedCheckpointRoot()``; and on ``SparkSession._instantiatedSession`` (the first session of
    this process). pyspark has no public API for a query's checkpoint location. None when the query is
    not found or any of that is missing (Spark Connect has no JVM objects in Python).
    """
    found = _running_query(spark, query_id)
    if found is None:
        return None
    try:
        return str(found[1].resolvedCheckpointRoot())
    except Exception:
        return None


@dataclass(frozen=True)
class QueryCheckpoint:
    """How Spark chose a running query's checkpoint (:func:`running_query_checkpoint_origin`)."""

    root: str
    """The resolved checkpoint root (a qualified URI, ``file:/...``)."""
    temporary: bool | None
    """Spark made it up (no ``checkpointLocation`` option, no ``spark.sql.streaming.checkpointLocation``) and deletes
    it when the query stops; None when that cannot be told."""
    query_name: str | None
    """The query's ``queryName``, if any."""
    session_root: str | None
    """The session's ``spark.sql.streaming.checkpointLocation`` (the root of checkpoints given by no option)."""


def running_query_checkpoint_origin(spark: SparkSession, query_id: str) -> QueryCheckpoint | None:
    """The checkpoint of the running streaming query ``query_id`` and how Spark chose it (classic Spark, not Connect).

    Checked on pyspark 4.3.0. Relies on what :func:`running_query_checkpoint` relies on, and on the private field
    ``deleteCheckpointOnStop`` of the JVM ``StreamExecution`` (read by Java reflection; Spark sets it exactly when
    it made a temporary checkpoint folder, ``ResolveWriteToStream``), on ``StreamExecution.name()`` and on the SQL
    configuration ``spark.sql.streaming.checkpointLocation``. None when the query is not found.
    """
    found = _running_query(spark, query_id)
    if found is None:
        return None
    session, execution = found
    try:
        root = str(execution.resolvedCheckpointRoot())
        name = execution.name()
    except Exception:
        return None
    temporary: bool | None = None
    try:
        cls = execution.getClass()
        while cls is not None:
            if "deleteCheckpointOnStop" in [f.getName() for f in cls.getDeclaredFields()]:
                field = cls.getDeclaredField("deleteCheckpointOnStop")
                field.setAccessible(True)
                temporary = bool(field.getBoolean(execution))
                break
            cls = cls.getSuperclass()
    except Exception:
        temporary = None
    try:
        session_root = session.conf.get("spark.sql.streaming.checkpointLocation", None)
    except Exception:
        session_root = None
    query_name = str(name) if name else None
    return QueryCheckpoint(root=root, temporary=temporary, query_name=query_name, session_root=session_root or None)


#: Spark expressions Spark calls deterministic that read the clock: each query Spark plans folds them to that query's
#: start time (its optimizer's ``ComputeCurrentTime``), so two jobs over one DataFrame see two different times.
CLOCK_EXPRESSIONS = frozenset({"CurrentTimestamp", "Now", "CurrentDate", "LocalTimestamp", "CurrentTime"})


def why_computed_twice_differs(df: DataFrame, column: str) -> str | None:
    """Why the value of ``df``'s ``column`` may differ between two Spark jobs over ``df`` (None: it cannot, as far as
    Spark's analysed plan tells): an expression Spark marks non-deterministic (``rand()``, ``uuid()``, a Python UDF
    marked ``asNondeterministic()``), or one that reads the clock (:data:`CLOCK_EXPRESSIONS`).

    Checked on pyspark 4.3.0. Relies on: ``DataFrame._jdf`` (classic Spark; Spark Connect has no JVM objects in
    Python), its ``queryExecution().analyzed()`` being a ``Project`` whose project list holds ``column``'s
    ``Alias``, and on Catalyst's ``Expression.deterministic()``, ``children()`` and the class names above.
    Raises ``LookupError`` when that is not what it finds (Spark Connect, another plan shape): the caller decides.
    """
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        raise LookupError("no JVM plan (Spark Connect)")
    plan = jdf.queryExecution().analyzed()
    if not hasattr(plan, "projectList"):
        raise LookupError(f"the analysed plan is a {plan.getClass().getSimpleName()}, not a Project")
    found = None
    items = plan.projectList().iterator()
    while items.hasNext():
        item = items.next()
        if item.getClass().getSimpleName() == "Alias" and item.name() == column:
            found = item
    if found is None:
        raise LookupError(f"column {column!r} is not computed by the last projection")
    if not found.deterministic():
        return "it is not deterministic (Spark computes it again, with another answer, in every job that reads it)"
    todo = [found]
    while todo:
        node = todo.pop()
        name = node.getClass().getSimpleName()
        if name in CLOCK_EXPRESSIONS:
            return (
                f"it reads the clock ({name}), which Spark fixes once per job: it is not deterministic across the "
                "jobs that read it"
            )
        children = node.children().iterator()
        while children.hasNext():
            todo.append(children.next())
    return None
