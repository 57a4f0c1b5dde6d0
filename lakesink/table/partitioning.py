"""The ``partitioned-by`` option: Iceberg's transform syntax, parsed once, resolved against a schema.

Syntax (as in Iceberg's Spark DDL, several terms separated by commas)::

    identity(col) | col
    years(col)  | year(col)
    months(col) | month(col)
    days(col)   | day(col)  | date(col)
    hours(col)  | hour(col) | date_hour(col)
    bucket(N, col)           (also bucket(col, N))
    truncate(W, col)         (also truncate(col, W))

Column names may be dotted paths into structs (``payload.ts``) and may be quoted with backticks
(```my col```). Partition values are computed by the executors with pyiceberg's transforms
(pyiceberg-core, i.e. iceberg-rust's implementation of the spec): time transforms in UTC, the bucket
hash on Iceberg's byte representation of each type.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)

from lakesink.errors import InvalidOptionError

PARTITIONED_BY = "partitioned-by"

_ALIASES = {
    "identity": "identity",
    "years": "years",
    "year": "years",
    "months": "months",
    "month": "months",
    "days": "days",
    "day": "days",
    "date": "days",
    "hours": "hours",
    "hour": "hours",
    "date_hour": "hours",
    "bucket": "bucket",
    "truncate": "truncate",
}
_WITH_PARAMETER = frozenset({"bucket", "truncate"})
_SUFFIX = {"identity": "", "years": "_year", "months": "_month", "days": "_day", "hours": "_hour"}
_VALID = "identity(col) or col, years(col), months(col), days(col), hours(col), bucket(N, col), truncate(W, col)"

_IDENT = r"(?:`[^`]+`|[A-Za-z_][\w$]*)(?:\.(?:`[^`]+`|[A-Za-z_][\w$]*))*"
_TERM = re.compile(rf"^\s*(?:(?P<fn>[A-Za-z_]+)\s*\((?P<args>[^()]*)\)|(?P<col>{_IDENT}))\s*$")


@dataclass(frozen=True)
class PartitionTerm:
    """One term of ``partitioned-by``: a transform of a column."""

    transform: str
    """identity, years, months, days, hours, bucket or truncate."""
    column: str
    """The column's path, dot-separated (without backticks)."""
    parameter: int | None = None
    """N of bucket(N), W of truncate(W)."""

    def __str__(self) -> str:
        col = ".".join(f"`{p}`" if not re.fullmatch(r"[A-Za-z_][\w$]*", p) else p for p in self.column.split("."))
        if self.parameter is not None:
            return f"{self.transform}({self.parameter}, {col})"
        return f"{self.transform}({col})"

    def iceberg_transform(self) -> Transform:  # type: ignore[type-arg]
        if self.transform == "bucket":
            assert self.parameter is not None
            return BucketTransform(self.parameter)
        if self.transform == "truncate":
            assert self.parameter is not None
            return TruncateTransform(self.parameter)
        return {
            "identity": IdentityTransform(),
            "years": YearTransform(),
            "months": MonthTransform(),
            "days": DayTransform(),
            "hours": HourTransform(),
        }[self.transform]

    def field_name(self) -> str:
        """The partition field's name, as Iceberg's Spark DDL names it (``ts_day``, ``id_bucket_16``)."""
        base = self.column.replace(".", "_")
        if self.transform in _WITH_PARAMETER:
            return f"{base}_{self.transform}_{self.parameter}"
        return base + _SUFFIX[self.transform]


def parse(value: str) -> tuple[PartitionTerm, ...]:
    """Parse the ``partitioned-by`` option; raise InvalidOptionError saying what is wrong and what is valid."""
    terms: list[PartitionTerm] = []
    for raw in _split_terms(value):
        if not raw.strip():
            raise InvalidOptionError(f"option '{PARTITIONED_BY}' has an empty term in {value!r}; valid terms: {_VALID}")
        terms.append(_parse_term(raw, value))
    if not terms:
        raise InvalidOptionError(f"option '{PARTITIONED_BY}' is empty; valid terms: {_VALID}")
    seen: dict[tuple[str, str], PartitionTerm] = {}
    for t in terms:
        kind = "a time transform" if t.transform in ("years", "months", "days", "hours") else f"{t.transform}{t.parameter or ''}"
        key = (kind, t.column)
        if key in seen:
            raise InvalidOptionError(
                f"option '{PARTITIONED_BY}': {seen[key]} and {t} partition the same column twice in the same way "
                "(Iceberg allows one time transform per column, and no repeated transform)"
            )
        seen[key] = t
    return tuple(terms)


def _split_terms(value: str) -> list[str]:
    """Split at commas outside parentheses and backticks."""
    terms, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(value):
        if ch == "`":
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
        elif not quoted and depth == 0 and ch == ",":
            terms.append(value[start:i])
            start = i + 1
    terms.append(value[start:])
    if depth != 0 or quoted:
        raise InvalidOptionError(f"option '{PARTITIONED_BY}': unbalanced parentheses or backticks in {value!r}")
    return terms if value.strip() else []


def _column(text: str, term: str, whole: str) -> str:
    text = text.strip()
    if not re.fullmatch(_IDENT, text):
        raise InvalidOptionError(f"option '{PARTITIONED_BY}': {text!r} in {term.strip()!r} is not a column name (in {whole!r})")
    return ".".join(p.strip("`") for p in re.findall(r"`[^`]+`|[^.]+", text))


def _parse_term(raw: str, whole: str) -> PartitionTerm:
    m = _TERM.match(raw)
    if m is None:
        raise InvalidOptionError(f"option '{PARTITIONED_BY}': cannot parse {raw.strip()!r} in {whole!r}; valid terms: {_VALID}")
    if m.group("col"):
        return PartitionTerm("identity", _column(m.group("col"), raw, whole))
    fn = m.group("fn").lower()
    if fn not in _ALIASES:
        raise InvalidOptionError(
            f"option '{PARTITIONED_BY}': unknown transform {m.group('fn')!r} in {raw.strip()!r}; valid terms: {_VALID}"
        )
    transform = _ALIASES[fn]
    args = [a.strip() for a in m.group("args").split(",")]
    if transform not in _WITH_PARAMETER:
        if len(args) != 1:
            raise InvalidOptionError(f"option '{PARTITIONED_BY}': {transform}() takes one column, got {raw.strip()!r}")
        return PartitionTerm(transform, _column(args[0], raw, whole))
    if len(args) != 2:
        raise InvalidOptionError(
            f"option '{PARTITIONED_BY}': {transform}() takes a number and a column, e.g. {transform}(16, id); got {raw.strip()!r}"
        )
    numbers = [a for a in args if re.fullmatch(r"\d+", a)]
    if len(numbers) != 1:
        raise InvalidOptionError(
            f"option '{PARTITIONED_BY}': {transform}() needs one positive integer and one column, got {raw.strip()!r}"
        )
    n = int(numbers[0])
    if n <= 0:
        raise InvalidOptionError(f"option '{PARTITIONED_BY}': {transform}() needs a positive integer, got {raw.strip()!r}")
    column = args[1] if args[0] == numbers[0] else args[0]
    return PartitionTerm(transform, _column(column, raw, whole), n)


def to_spec(terms: tuple[PartitionTerm, ...], schema: Schema, table: str) -> PartitionSpec:
    """The partition spec of ``terms`` over ``schema`` (field ids assigned); errors list every problem."""
    problems: list[str] = []
    fields: list[PartitionField] = []
    for i, term in enumerate(terms):
        try:
            source = schema.find_field(term.column)
        except ValueError:
            problems.append(f"{term}: no column {term.column!r} in the stream (columns: {', '.join(schema.column_names)})")
            continue
        transform = term.iceberg_transform()
        if not transform.can_transform(source.field_type):
            problems.append(
                f"{term}: transform {term.transform} cannot be applied to column {term.column!r} of type {source.field_type}"
            )
            continue
        fields.append(PartitionField(source_id=source.field_id, field_id=1000 + i, transform=transform, name=term.field_name()))
    if problems:
        raise InvalidOptionError(f"option '{PARTITIONED_BY}' for table {table}:\n  - " + "\n  - ".join(problems))
    return PartitionSpec(*fields, spec_id=0)


def describe(spec: PartitionSpec, schema: Schema) -> str:
    """A spec in the option's syntax, e.g. ``days(ts), bucket(16, id)``."""
    out = []
    for f in spec.fields:
        column = schema.find_column_name(f.source_id) or f"<field {f.source_id}>"
        name = {
            IdentityTransform: "identity",
            YearTransform: "years",
            MonthTransform: "months",
            DayTransform: "days",
            HourTransform: "hours",
        }.get(type(f.transform))
        if isinstance(f.transform, BucketTransform):
            out.append(str(PartitionTerm("bucket", column, f.transform.num_buckets)))
        elif isinstance(f.transform, TruncateTransform):
            out.append(str(PartitionTerm("truncate", column, f.transform.width)))
        elif name is not None:
            out.append(str(PartitionTerm(name, column)))
        else:
            out.append(f"{f.transform}({column})")
    return ", ".join(out) if out else "unpartitioned"


def same_terms(spec: PartitionSpec, terms: tuple[PartitionTerm, ...], schema: Schema) -> bool:
    """Whether a table's spec is exactly ``terms`` (same transforms of the same columns, same order)."""
    if len(spec.fields) != len(terms):
        return False
    for f, term in zip(spec.fields, terms, strict=True):
        try:
            source = schema.find_field(term.column)
        except ValueError:
            return False
        if f.source_id != source.field_id or f.transform != term.iceberg_transform():
            return False
    return True
