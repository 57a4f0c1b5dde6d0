"""lakesink.options: the sink options, parsed from Spark's option map and from a plain mapping."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import json
import re
from pathlib import Path

import pytest

import lakesink
from lakesink.errors import InvalidOptionError
from lakesink.options import (
    OPTIONS,
    READ_VALID_OPTIONS,
    VALID_OPTIONS,
    Entry,
    Option,
    OutputMode,
    SinkOptions,
    TableName,
)
from lakesink.options.declaration import _as_text
from lakesink.table import keys
from tests.support.helpers import assert_refused

VALID_LIST = (
    "valid options: table, catalog, catalog.<property>, checkpointLocation, create-table, partitioned-by, merge-schema, "
    "branch, sink-id, upsert-key, delete-when, order-by, table-property.<property>, format-version, maintenance, event-time, "
    "dead-letter-table, reject-when, max-rejected-fraction, route-by, namespace, route-namespaces, atomic, payload, cdc-format, "
    "cdc-transactions, cdc-transaction-wait, cdc-unavailable-value, metrics, history, history-time"
)


# --- from_spark_options ---------------------------------------------------------------------------


def test_spark_options_minimal_gives_the_defaults() -> None:
    opts = SinkOptions.from_spark_options({"table": "db.events"}, overwrite=False)
    assert opts == SinkOptions(
        table=TableName(("db",), "events"),
        catalog_name=None,
        catalog_properties={},
        output_mode=OutputMode.APPEND,
        checkpoint_location=None,
        create_table=True,
    )


def test_spark_options_all_lower_cased_as_spark_passes_them() -> None:
    opts = SinkOptions.from_spark_options(
        {
            "table": "db.events",
            "catalog": " prod ",
            "catalog.uri": "http://rest:8181",
            "catalog.s3.endpoint": "http://minio:9000",
            "checkpointlocation": "/ck/events",
            "create-table": "false",
            "path": "ignored",
            "queryname": "ignored too",
        },
        overwrite=False,
    )
    assert opts.table == TableName(("db",), "events")
    assert opts.catalog_name == "prod"
    assert dict(opts.catalog_properties) == {"uri": "http://rest:8181", "s3.endpoint": "http://minio:9000"}
    assert opts.checkpoint_location == "/ck/events"
    assert opts.create_table is False
    assert opts.output_mode is OutputMode.APPEND


def test_spark_options_keys_in_any_case_are_accepted() -> None:
    opts = SinkOptions.from_spark_options(
        {"TABLE": "db.events", "checkpointLocation": "/ck", "Create-Table": "no"}, overwrite=False
    )
    assert str(opts.table) == "db.events"
    assert opts.checkpoint_location == "/ck"
    assert opts.create_table is False


@pytest.mark.parametrize(("overwrite", "mode"), [(False, OutputMode.APPEND), (True, OutputMode.COMPLETE)])
def test_spark_overwrite_flag_is_complete_mode(overwrite: bool, mode: OutputMode) -> None:
    assert SinkOptions.from_spark_options({"table": "db.t"}, overwrite=overwrite).output_mode is mode


def test_unknown_option_is_named_with_the_valid_options() -> None:
    with pytest.raises(InvalidOptionError) as e:
        SinkOptions.from_spark_options({"table": "db.t", "tabel": "db.x", "mergeschema": "true"}, overwrite=False)
    # each with its nearest valid name (issue 54); the long list then left to docs/options.md
    said = "unknown option(s) 'mergeschema' (did you mean 'merge-schema'?), 'tabel' (did you mean 'table'?)"
    assert str(e.value) == f"{said}; every option is in docs/options.md"
    with pytest.raises(InvalidOptionError) as e:
        SinkOptions.from_spark_options({"table": "db.t", "tabel": "db.x", "colour": "red"}, overwrite=False)
    assert str(e.value) == f"unknown option(s) 'colour', 'tabel' (did you mean 'table'?); {VALID_LIST}"


@pytest.mark.parametrize(
    ("given", "meant"), [("upsert_key", "upsert-key"), ("partition-by", "partitioned-by"), ("Route_By", "route-by")]
)
def test_a_misspelled_option_names_the_nearest_one(given: str, meant: str) -> None:
    """Issue 54: ``.option("upsert_key", "id")`` said only "unknown option" and listed 27 names."""
    for spark_options in (True, False):
        with pytest.raises(InvalidOptionError) as e:
            if spark_options:
                SinkOptions.from_spark_options({"table": "db.t", given: "id"}, overwrite=False)
            else:
                SinkOptions.from_mapping({"table": "db.t", given: "id"})
        assert f"'{given.lower()}' (did you mean '{meant}'?)" in str(e.value), str(e.value)


def test_invalid_option_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        SinkOptions.from_spark_options({"table": "db.t", "nope": "1"}, overwrite=False)


@pytest.mark.parametrize("options", [{}, {"table": ""}, {"table": "   "}, {"catalog": "x"}])
def test_missing_or_empty_table_is_rejected(options: dict[str, str]) -> None:
    with pytest.raises(InvalidOptionError) as e:
        SinkOptions.from_spark_options(options, overwrite=False)
    assert str(e.value) == (
        "option 'table' is required (for example .option('table', 'db.events')), or option 'route-by' (each row goes "
        "to the table its column names)"
    )


@pytest.mark.parametrize("table", [None, "", "   "])
def test_foreach_batch_without_a_table_is_told_in_its_own_spelling(table: str | None) -> None:
    """Issue 54: foreach_batch() without a table suggested .option('table', ...), format("lakesink")'s spelling."""
    with pytest.raises(InvalidOptionError) as e:
        lakesink.foreach_batch(table)
    assert str(e.value) == (
        "foreach_batch() needs the table (for example lakesink.foreach_batch('db.events')), or route_by= (each row goes "
        "to the table its column names)"
    )


@pytest.mark.parametrize("bad", ["events", "db..x", ".events", "db.", "db. .x", "."])
def test_bad_table_name_is_rejected_with_the_expected_form(bad: str) -> None:
    with pytest.raises(InvalidOptionError) as e:
        SinkOptions.from_spark_options({"table": bad}, overwrite=False)
    assert str(e.value) == f"option 'table' must be '<namespace>.<table>' (for example 'db.events'), got {bad!r}"


def test_table_name_with_a_multi_level_namespace() -> None:
    name = TableName.parse(" lake . raw . events ")
    assert name == TableName(("lake", "raw"), "events")
    assert name.identifier == ("lake", "raw", "events")
    assert str(name) == "lake.raw.events"


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("TRUE", True), (" 1 ", True), ("yes", True), ("false", False), ("0", False), ("No", False)],
)
def test_create_table_boolean_spellings(value: str, expected: bool) -> None:
    opts = SinkOptions.from_spark_options({"table": "db.t", "create-table": value}, overwrite=False)
    assert opts.create_table is expected


@pytest.mark.parametrize("value", ["maybe", "", "2", "truee"])
def test_create_table_invalid_value_names_the_option_and_valid_values(value: str) -> None:
    with pytest.raises(InvalidOptionError) as e:
        SinkOptions.from_spark_options({"table": "db.t", "create-table": value}, overwrite=False)
    assert str(e.value) == f"option 'create-table' must be 'true' or 'false', got {value!r}"


def test_empty_catalog_property_name_is_rejected() -> None:
    with pytest.raises(InvalidOptionError) as e:
        SinkOptions.from_spark_options({"table": "db.t", "catalog.": "x"}, overwrite=False)
    assert str(e.value) == "option 'catalog.' needs a property name after the dot"


def test_empty_catalog_name_is_rejected() -> None:
    with pytest.raises(InvalidOptionError) as e:
        SinkOptions.from_spark_options({"table": "db.t", "catalog": "  "}, overwrite=False)
    assert str(e.value) == "option 'catalog' must not be empty"


@pytest.mark.parametrize("key", ["output-mode", "Output-Mode"])
def test_output_mode_option_is_rejected_with_format_lakesink(key: str) -> None:
    with pytest.raises(InvalidOptionError) as e:
        SinkOptions.from_spark_options({"table": "db.t", key: "complete"}, overwrite=True)
    assert str(e.value) == (
        "option 'output-mode' is not used with format('lakesink'): set the mode with "
        ".outputMode('append') or .outputMode('complete')"
    )


# --- from_mapping ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "mode"),
    [("append", OutputMode.APPEND), ("complete", OutputMode.COMPLETE), (" Complete ", OutputMode.COMPLETE)],
)
def test_mapping_output_mode(value: str, mode: OutputMode) -> None:
    assert SinkOptions.from_mapping({"table": "db.t", "output-mode": value}).output_mode is mode


def test_mapping_output_mode_defaults_to_append() -> None:
    assert SinkOptions.from_mapping({"table": "db.t"}).output_mode is OutputMode.APPEND


@pytest.mark.parametrize("value", ["overwrite", ""])
def test_mapping_unsupported_output_mode_names_the_supported_modes(value: str) -> None:
    with pytest.raises(InvalidOptionError) as e:
        SinkOptions.from_mapping({"table": "db.t", "output-mode": value})
    message = str(e.value)
    assert message.startswith(f"output mode {value!r} is not supported by lakesink; supported modes: append, complete, update")
    assert "'update' needs option 'upsert-key'" in message


@pytest.mark.parametrize("value", ["update", "UPDATE"])
def test_mapping_update_mode_needs_an_upsert_key(value: str) -> None:
    """Issue 12: Spark's update mode is supported with upserts (docs/upserts.md), and only with them."""
    assert_refused({"table": "db.t", "output-mode": value}, r"output mode 'update' needs option 'upsert-key'")
    opts = SinkOptions.from_mapping({"table": "db.t", "output-mode": value, "upsert-key": "id"})
    assert opts.output_mode is OutputMode.UPDATE and opts.upsert_key == ("id",)


def test_mapping_keeps_the_case_of_catalog_property_names() -> None:
    opts = SinkOptions.from_mapping(
        {
            "table": "db.t",
            "catalog.header.X-Iceberg-Access-Delegation": "vended-credentials",
            "Catalog.s3.Endpoint": "http://minio:9000",
            "checkpointLocation": "/ck",
            "create-table": "False",
        }
    )
    assert dict(opts.catalog_properties) == {
        "header.X-Iceberg-Access-Delegation": "vended-credentials",
        "s3.Endpoint": "http://minio:9000",
    }
    assert opts.checkpoint_location == "/ck"
    assert opts.create_table is False


def test_mapping_unknown_option_lists_the_valid_options() -> None:
    with pytest.raises(InvalidOptionError) as e:
        SinkOptions.from_mapping({"table": "db.t", "outputMode": "append"})
    assert str(e.value) == f"unknown option(s) 'outputmode'; {VALID_LIST}"


# --- repr never shows a secret --------------------------------------------------------------------


def test_repr_hides_secret_catalog_properties() -> None:
    opts = SinkOptions.from_spark_options(
        {
            "table": "db.t",
            "catalog.uri": "postgresql://lake:Pg-Pa55word@db.example.com:5432/iceberg",
            "catalog.s3.secret-access-key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "catalog.s3.session-token": "FwoGZXIvYXdzEXAMPLETOKEN",
            "catalog.credential": "client-id:client-s3cret-value",
            "catalog.s3.endpoint": "http://minio:9000",
        },
        overwrite=False,
    )
    for text in (repr(opts), str(opts), f"{opts}", repr([opts])):
        for secret in ("Pg-Pa55word", "wJalrXUtnFEMI", "EXAMPLEKEY", "FwoGZXIvYXdzEXAMPLETOKEN", "client-s3cret-value"):
            assert secret not in text
        # what is not secret stays readable
        assert "postgresql://lake:***@db.example.com:5432/iceberg" in text
        assert "'s3.secret-access-key': '***'" in text
        assert "'s3.endpoint': 'http://minio:9000'" in text
        assert "table='db.t'" in text


def test_repr_shows_every_field() -> None:
    opts = SinkOptions.from_mapping(
        {
            "table": "db.t",
            "catalog": "prod",
            "output-mode": "complete",
            "checkpointLocation": "/ck",
            "create-table": "0",
            "partitioned-by": "days(ts), bucket(16, id)",
            "merge-schema": "yes",
            "sink-id": "audit",
            "table-property.write.target-file-size-bytes": "1024",
            "format-version": "2",
            "maintenance": "off",
            "metrics": "prometheus:9108",
        }
    )
    assert repr(opts) == (
        "SinkOptions(table='db.t', catalog_name='prod', catalog_properties={}, output_mode='complete', "
        "checkpoint_location='/ck', create_table=False, partitioned_by='days(ts), bucket(16, id)', merge_schema=True, "
        "branch='main', writer='auto', sink_id='audit', upsert_key=(), delete_when=None, order_by=None, "
        "table_properties={'write.target-file-size-bytes': '1024'}, format_version=2, maintenance='off', event_time=None, "
        "dead_letter_table=None, reject_when=None, max_rejected_fraction=1.0, allow_temporary_checkpoint=False, routing=None, "
        "payload=None, cdc_format=None, cdc_transactions='off', cdc_transaction_wait=600.0, "
        "cdc_unavailable_value='__debezium_unavailable_value', metrics='prometheus:127.0.0.1:9108', history=None, "
            "history_time=None)"
    )


def test_allow_temporary_checkpoint_is_foreach_batch_only() -> None:
    assert SinkOptions.from_mapping({"table": "db.t", "allow-temporary-checkpoint": "true"}).allow_temporary_checkpoint
    assert not SinkOptions.from_mapping({"table": "db.t"}).allow_temporary_checkpoint
    with pytest.raises(InvalidOptionError, match="'allow-temporary-checkpoint' is not used with format"):
        SinkOptions.from_spark_options({"table": "db.t", "allow-temporary-checkpoint": "true"}, overwrite=False)


@pytest.mark.parametrize("value", ["", " ", "a.b", "a b", "x" * 65, "é"])
def test_invalid_sink_id_names_the_option_and_the_valid_form(value: str) -> None:
    assert_refused({"table": "db.t", "sink-id": value}, "option 'sink-id' must be 1 to 64 characters")


def test_event_time_names_one_column() -> None:
    assert SinkOptions.from_spark_options({"table": "db.t", "event-time": " ts "}, overwrite=False).event_time == "ts"
    assert SinkOptions.from_mapping({"table": "db.t"}).event_time is None
    for bad in ("", "a,b"):
        assert_refused({"table": "db.t", "event-time": bad}, "option 'event-time' must name one column")


def test_dead_letters_with_route_by_serve_every_routed_table() -> None:
    o = SinkOptions.from_mapping({"route-by": "dest", "dead-letter-table": "db.dead", "reject-when": "id < 0"})
    assert o.routing is not None and str(o.dead_letter_table) == "db.dead" and o.reject_when == "id < 0"
    # one dead-letter table for the routed sink: a routed table's own options have none (lakesink.driver.committers.routed)
    assert o.for_table(TableName(("db",), "a")).dead_letter_table is None


def test_history_with_a_dead_letter_table_is_taken_unless_one_is_named_as_the_other() -> None:
    """Option history with option dead-letter-table (issue 55: a dead letter is never a version, docs/history.md); a
    dead-letter table the history pattern would give a table (routed: any table) as its history is refused."""
    one = {"table": "db.t", "upsert-key": "id", "history": "on", "history-time": "ts"}
    o = SinkOptions.from_mapping({**one, "dead-letter-table": "db.dead", "reject-when": "id < 0"})
    assert str(o.dead_letter_table) == "db.dead" and o.history is not None
    assert_refused({**one, "dead-letter-table": "db.t__history"}, "is the history table option 'history'")
    routed = {"route-by": "dest", "upsert-key": "id", "history": "audit.{table}_versions", "history-time": "ts"}
    assert SinkOptions.from_mapping({**routed, "dead-letter-table": "db.dead"}).dead_letter_table is not None
    assert_refused({**routed, "dead-letter-table": "audit.dead_versions"}, "named as option 'history'")


# --- one declaration per option (lakesink.options.OPTIONS) -------------------------------------------

DOCS = Path(__file__).resolve().parent.parent / "docs" / "options.md"


def _section(title: str) -> list[str]:
    """The lines of docs/options.md's section ``## <title>`` (up to the next ``## ``)."""
    lines = DOCS.read_text(encoding="utf-8").splitlines()
    start = lines.index(f"## {title}") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def _table(lines: list[str]) -> list[list[str]]:
    """The body rows of the section's first Markdown table, as cells."""
    rows = [line for line in itertools.dropwhile(lambda x: not x.startswith("|"), lines)]
    rows = list(itertools.takewhile(lambda x: x.startswith("|"), rows))[2:]
    return [[c.strip() for c in row.strip().strip("|").split("|")] for row in rows]  # prose cells may hold "|": use the first


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _py(value: object) -> str:
    """A default as the docs write it (strings in double quotes)."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _comment_block(lines: list[str], first: str) -> str:
    """A printed output shown as comments (``# ...`` continued by ``#   ...``), joined into one line."""
    i = next(i for i, line in enumerate(lines) if line.startswith(f"# {first}"))
    text = [lines[i][2:]]
    for line in lines[i + 1 :]:
        if not line.startswith("#   "):
            break
        text.append(line[4:])
    return " ".join(text)


def test_foreach_batch_signature_is_the_declaration() -> None:
    """foreach_batch keeps an explicit signature (types and completion for IDEs, mypy on callers): it must name every
    declared option, in the declaration's order, with the declared default."""
    params = list(inspect.signature(lakesink.foreach_batch).parameters.values())
    assert [(p.name, p.default) for p in params] == [(o.keyword, o.default) for o in OPTIONS]
    assert params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD  # the table, positional
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[1:])
    documented = re.findall(r"(?m)^    ([a-z_]+): ", inspect.getdoc(lakesink.foreach_batch) or "")
    assert documented == [o.keyword for o in OPTIONS]


def test_sink_options_fields_follow_the_declaration() -> None:
    declared = list(dict.fromkeys(o.field_name for o in OPTIONS))
    assert [f.name for f in dataclasses.fields(SinkOptions)] == declared


def test_foreach_batch_defaults_are_the_defaults_of_absent_options() -> None:
    keywords = {o.keyword: o.default for o in OPTIONS} | {"table": "db.t"}
    assert SinkOptions.from_keywords(keywords) == SinkOptions(table=TableName(("db",), "t"))
    assert SinkOptions.from_keywords(keywords) == SinkOptions.from_mapping({"table": "db.t"})


def test_keywords_become_their_options() -> None:
    o = SinkOptions.from_keywords(
        {
            "table": "db.t",
            "catalog_properties": {"Header.X": "v"},
            "upsert_key": ["tenant", "id"],
            "table_properties": {"write.target-file-size-bytes": 1024},
            "format_version": 1,
            "merge_schema": True,
            "checkpoint_location": "/ck",
            "output_mode": "update",
        }
    )
    assert dict(o.catalog_properties) == {"Header.X": "v"} and o.upsert_key == ("tenant", "id")
    assert dict(o.table_properties) == {"write.target-file-size-bytes": "1024"} and o.format_version == 1
    assert o.merge_schema and o.checkpoint_location == "/ck" and o.output_mode is OutputMode.UPDATE
    with pytest.raises(TypeError, match="'colour'"):
        SinkOptions.from_keywords({"table": "db.t", "colour": "red"})


@pytest.mark.parametrize("option", [o for o in OPTIONS if Entry.SPARK not in o.entries], ids=lambda o: o.key)
def test_foreach_batch_only_options_are_refused_by_format_lakesink(option: Option) -> None:
    assert option.spark_refusal and option.parse is not None
    with pytest.raises(InvalidOptionError, match=f"option '{option.key}' is not used with format"):
        SinkOptions.from_spark_options({"table": "db.t", option.key: _as_text(option.default)}, overwrite=False)


def test_valid_options_are_the_declared_ones() -> None:
    assert VALID_LIST == f"valid options: {', '.join(VALID_OPTIONS)}"
    assert VALID_OPTIONS == tuple(o.shown for o in OPTIONS if Entry.SPARK in o.entries)


def test_docs_format_lakesink_table_is_the_declaration() -> None:
    rows = _table(_section('`writeStream.format("lakesink")` options'))
    documented = [(name, row[1], row[2]) for row in rows for name in _names(row[0])]
    assert documented == [(o.shown, o.required, o.absent) for o in OPTIONS if Entry.SPARK in o.entries]


def test_docs_foreach_batch_table_is_the_declaration() -> None:
    rows = _table(_section("`lakesink.foreach_batch(...)` arguments"))
    documented = [(name, row[1]) for row in rows for name in _names(row[0])]
    assert [name for name, _ in documented] == [o.keyword for o in OPTIONS]
    for (name, default), option in zip(documented, OPTIONS, strict=True):
        assert default.startswith(f"`{_py(option.default)}`"), (name, default)


def foreach_batch_listing() -> str:
    """The ``python no-run`` listing of foreach_batch's arguments in docs/options.md, made from the declaration."""
    lines = ["lakesink.foreach_batch("]
    for i, option in enumerate(OPTIONS):
        lines.append(f"    {option.keyword}={_py(option.default)},".ljust(40) + f"# {option.doc}")
        if i == 0:
            lines.append("    *,")
    return "\n".join([*lines, ")"])


def test_docs_foreach_batch_listing_is_the_declaration() -> None:
    text = "\n".join(_section("`lakesink.foreach_batch(...)` arguments"))
    listing = text.split("```python no-run\n", 1)[1].split("\n```", 1)[0]
    assert listing == foreach_batch_listing(), "docs/options.md should list:\n" + foreach_batch_listing()


def test_docs_read_options_table_is_the_read_options() -> None:
    rows = _table(_section('`spark.read.format("lakesink")` options'))
    assert [name for row in rows for name in _names(row[0])] == list(READ_VALID_OPTIONS)


def test_docs_environment_table_names_every_variable_of_table_keys() -> None:
    rows = _table(_section("Environment variables"))
    documented = {name for row in rows for name in _names(row[0]) if name.startswith("LAKESINK_")}
    assert documented == {v for k, v in vars(keys).items() if k.startswith("ENV_")}


def test_docs_printed_errors_and_repr_are_the_real_ones() -> None:
    """The outputs docs/options.md shows as comments are what the code prints (the list of valid options was 8 short)."""
    lines = DOCS.read_text(encoding="utf-8").splitlines()
    with pytest.raises(InvalidOptionError) as e:
        SinkOptions.from_spark_options({"table": "db.events", "colour": "red"}, overwrite=False)
    assert _comment_block(lines, "unknown option(s) 'colour'") == str(e.value)
    options = SinkOptions.from_mapping(
        {"table": "db.events", "catalog.type": "sql", "catalog.uri": "postgresql+psycopg2://writer:s3cret@db.invalid/iceberg"}
    )
    assert _comment_block(lines, "SinkOptions(") == repr(options)
