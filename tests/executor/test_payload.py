"""Option payload, executor side (lakesink.executor.payload): JSON values to column types, a table's rows from their
payloads, and the loud errors (a value that does not fit, a field the table lacks, two JSON types in one field)."""

from __future__ import annotations

import json
import pickle
from datetime import date, datetime, timezone
from decimal import Decimal

import pyarrow as pa
import pytest

from lakesink.errors import SchemaMismatchError
from lakesink.executor import payload


def payloads(*objects: object) -> pa.RecordBatch:
    texts = [None if o is None else json.dumps(o) for o in objects]
    return pa.record_batch({"route": ["db.t"] * len(texts), "doc": pa.array(texts, pa.string()), "seq": list(range(len(texts)))})


def test_json_values_become_column_types_unified_over_the_batch() -> None:
    objects = [
        {"id": 1, "name": "a", "score": 1, "ok": True, "tags": [], "info": {"x": 1}, "gone": None},
        {"id": 2, "name": None, "score": 2.5, "ok": False, "tags": ["p"], "info": {"y": "s"}, "gone": None},
    ]
    columns = payload.merge_columns([payload.columns_of(objects, "db.t")], "db.t")
    assert columns == pa.schema(
        [
            ("id", pa.int64()),
            ("name", pa.string()),
            ("score", pa.float64()),
            ("ok", pa.bool_()),
            ("tags", pa.list_(pa.string())),
            ("info", pa.struct([("x", pa.int64()), ("y", pa.string())])),
        ]
    )  # "gone": null in every payload, no column


def test_the_inference_job_answers_per_route() -> None:
    batch = pa.record_batch(
        {"route": ["db.a", "db.b", "db.a"], "doc": [json.dumps({"id": 1}), json.dumps({"k": "x"}), json.dumps({"id": 2.5})]}
    )
    out = pa.Table.from_batches(list(payload.PayloadInference("route", "doc")(iter([batch])))).to_pylist()
    found = {r["route"]: pickle.loads(r["columns"]) for r in out}
    assert found == {b"db.a": {"id": pa.float64()}, b"db.b": {"k": pa.string()}}


def test_two_json_types_in_one_field_are_refused_naming_table_and_field() -> None:
    with pytest.raises(SchemaMismatchError, match=r"table db\.t: payload field 'id' holds values of two JSON types"):
        payload.columns_of([{"id": 1}, {"id": "1"}], "db.t")


def test_rows_are_cast_to_an_existing_tables_columns() -> None:
    target = pa.schema(
        [
            ("id", pa.int32()),
            ("day", pa.date32()),
            ("at", pa.timestamp("us", tz="UTC")),
            ("amount", pa.decimal128(10, 2)),
            ("name", pa.string()),
            ("added_later", pa.string()),
        ]
    )
    rows = payloads(
        {"id": 1, "day": "2024-02-29", "at": "2024-02-29T10:00:00.5+00:00", "amount": "12.30", "name": "a"},
        {"id": 2, "day": None, "at": None, "amount": None, "name": None, "dropped_at_source": None},
    )
    out = payload.expand(rows, "doc", target, "db.t", keep=["seq"])
    assert out.schema.names == [*target.names, "seq"]
    assert out.to_pylist()[0] == {
        "id": 1,
        "day": date(2024, 2, 29),
        "at": datetime(2024, 2, 29, 10, 0, 0, 500000, tzinfo=timezone.utc),
        "amount": Decimal("12.30"),
        "name": "a",
        "added_later": None,  # a column the payload lacks: null
        "seq": 0,
    }
    assert out.column("id").to_pylist() == [1, 2]


def test_a_value_that_does_not_fit_names_table_column_and_value() -> None:
    target = pa.schema([("id", pa.int32())])
    with pytest.raises(SchemaMismatchError, match=r"table db\.t, column 'id' \(int32\): a payload holds 'x'"):
        payload.expand(payloads({"id": 1}, {"id": "x"}), "doc", target, "db.t")


def test_a_value_pyarrow_would_change_does_not_fit() -> None:
    """pyarrow builds 7.5 into a long column as 7, true into a double as 1.0, 1e300 into a float as infinity (also in a
    struct or a list): each is a value that does not fit, never a silent change (before: 7.5 was committed as 7)."""
    target = pa.schema(
        [
            ("n", pa.int64()),
            ("x", pa.float64()),
            ("f", pa.float32()),
            ("s", pa.struct([("a", pa.int32())])),
            ("l", pa.list_(pa.int64())),
        ]
    )
    rows = payloads(
        {"n": 7.0, "x": 1, "f": 1.5, "s": {"a": 2.0}, "l": [1, 2.0]},  # each value exact in its column: fits
        {"n": 7.5},
        {"x": True},
        {"f": 1e300},
        {"s": {"a": 0.5}},
        {"l": [1, 2.5]},
        {"n": False},
    )
    out, misfits = payload.expand_fitting(rows, "doc", target, "db.t")
    assert out.to_pylist() == [{"n": 7, "x": 1.0, "f": 1.5, "s": {"a": 2}, "l": [1, 2]}]
    assert [(m.row, m.column) for m in misfits] == [(1, "n"), (2, "x"), (3, "f"), (4, "s"), (5, "l"), (6, "n")]
    assert "column 'n' (int64): a payload holds 7.5" in misfits[0].message
    with pytest.raises(SchemaMismatchError, match=r"column 'n' \(int64\): a payload holds 7\.5"):
        payload.expand(payloads({"n": 7.5}), "doc", target, "db.t")


def test_a_field_the_table_lacks_is_refused_unless_null() -> None:
    target = pa.schema([("id", pa.int64())])
    assert payload.expand(payloads({"id": 1, "extra": None}), "doc", target, "db.t").num_rows == 1
    with pytest.raises(SchemaMismatchError, match=r"table db\.t has no column 'extra'.*merge-schema=true"):
        payload.expand(payloads({"id": 1, "extra": 5}), "doc", target, "db.t")


def test_a_payload_that_is_not_a_json_object_is_refused() -> None:
    target = pa.schema([("id", pa.int64())])
    bad = pa.record_batch({"doc": pa.array(["{not json"], pa.string())})
    with pytest.raises(SchemaMismatchError, match=r"payload column 'doc' of a row routed to table db\.t is not JSON"):
        payload.expand(bad, "doc", target, "db.t")
    with pytest.raises(SchemaMismatchError, match=r"is a JSON array, not an object"):
        payload.expand(payloads([1]), "doc", target, "db.t")


def test_a_binary_column_takes_base64_text_and_refuses_other_text() -> None:
    target = pa.schema([("blob", pa.binary())])
    out = payload.expand(payloads({"blob": "AAEC/w=="}, {"blob": None}), "doc", target, "db.t")
    assert out.column("blob").to_pylist() == [b"\x00\x01\x02\xff", None]
    with pytest.raises(SchemaMismatchError, match=r"table db\.t, column 'blob' \(binary\): a payload holds 'not base64!'"):
        payload.expand(payloads({"blob": "not base64!"}), "doc", target, "db.t")


def test_a_debezium_connect_schema_types_the_fields() -> None:
    """cdc-format=debezium with schemas.enable: each field typed by the record's Connect schema (lakesink.cdc.connect),
    Debezium's encodings decoded; without the schema the same JSON would be longs and strings."""
    import base64
    import datetime as dt
    from decimal import Decimal

    fields = [
        {"type": "int16", "field": "small"},
        {"type": "int64", "field": "big"},
        {
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "2", "connect.decimal.precision": "12"},
            "field": "amount",
        },
        {"type": "int32", "name": "io.debezium.time.Date", "field": "day"},
        {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "field": "at"},
        {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "field": "zoned"},
        {"type": "float", "field": "f"},
        {"type": "double", "field": "d"},
        {"type": "bytes", "field": "raw"},
        {"type": "string", "name": "io.debezium.data.Uuid", "field": "uid"},
    ]
    schema = json.dumps({"type": "struct", "fields": [{"type": "struct", "fields": fields, "field": "after"}]})
    doc = {
        "small": -3,
        "big": 2**40,
        "amount": base64.b64encode((-1230).to_bytes(2, "big", signed=True)).decode(),
        "day": -1,
        "at": 1_000_001,
        "zoned": "2024-01-02T03:04:05.000006+02:00",
        "f": 0.5,
        "d": "-Infinity",
        "raw": base64.b64encode(b"\x00\xff").decode(),
        "uid": None,
    }
    batch = pa.record_batch({"route": ["db.t"], "doc": [json.dumps(doc)], "s": [schema]})
    out = pa.Table.from_batches(list(payload.PayloadInference("route", "doc", schema_column="s")(iter([batch])))).to_pylist()
    columns = pickle.loads(out[0]["columns"])
    assert columns == {
        "small": pa.int32(),
        "big": pa.int64(),
        "amount": pa.decimal128(12, 2),
        "day": pa.date32(),
        "at": pa.timestamp("us"),
        "zoned": pa.timestamp("us", tz="UTC"),
        "f": pa.float32(),
        "d": pa.float64(),
        "raw": pa.binary(),
        "uid": pa.string(),
    }  # "uid" null in every payload: typed by the schema all the same
    target = pa.schema([pa.field(n, t) for n, t in columns.items()])
    rows = payload.expand(batch, "doc", target, "db.t", schema_column="s").to_pylist()
    assert rows == [
        {
            "small": -3,
            "big": 2**40,
            "amount": Decimal("-12.30"),
            "day": dt.date(1969, 12, 31),
            "at": dt.datetime(1970, 1, 1, 0, 0, 1, 1),
            "zoned": dt.datetime(2024, 1, 2, 1, 4, 5, 6, tzinfo=dt.timezone.utc),
            "f": 0.5,
            "d": float("-inf"),
            "raw": b"\x00\xff",
            "uid": None,
        }
    ]


def test_with_a_dead_letter_table_the_rows_whose_values_do_not_fit_are_taken_out_named() -> None:
    target = pa.schema([("id", pa.int64()), ("n", pa.int32()), ("day", pa.date32())])
    rows = payloads(
        {"id": 1, "n": 5, "day": "2024-02-29"},
        {"id": 2, "n": "five", "day": "2024-02-29"},  # n does not fit
        {"id": 3, "n": 2**40, "day": None},  # beyond an int
        {"id": 4, "n": 7, "day": "not a date"},
        {"id": 5, "n": 8, "day": None},
    )
    out, misfits = payload.expand_fitting(rows, "doc", target, "db.t", keep=["seq"])
    assert out.to_pylist() == [
        {"id": 1, "n": 5, "day": date(2024, 2, 29), "seq": 0},
        {"id": 5, "n": 8, "day": None, "seq": 4},
    ]
    assert [(m.row, m.column) for m in misfits] == [(1, "n"), (2, "n"), (3, "day")]
    assert "table db.t, column 'n' (int32): a payload holds 'five'" in misfits[0].message
    assert "nothing was committed" not in misfits[0].message


def test_a_deleted_row_is_a_misfit_only_by_its_key() -> None:
    target = pa.schema([("id", pa.int64()), ("n", pa.int32())])
    rows = payloads({"id": 1, "n": "bad"}, {"id": "x", "n": 1}, {"id": 3, "n": "bad"})
    rows = rows.append_column("deleted", pa.array([True, True, False]))
    out, misfits = payload.expand_fitting(rows, "doc", target, "db.t", keep=["deleted"], deleted_column="deleted", key=["id"])
    assert out.to_pylist() == [{"id": 1, "n": None, "deleted": True}]  # a delete reads only its key
    assert [(m.row, m.column) for m in misfits] == [(1, "id"), (2, "n")]


def test_values_of_several_json_types_that_each_fit_are_kept() -> None:
    target = pa.schema([("s", pa.string())])
    out, misfits = payload.expand_fitting(payloads({"s": "a"}, {"s": 1}), "doc", target, "db.t")
    assert misfits == [] and out.column("s").to_pylist() == ["a", "1"]


def test_with_a_dead_letter_table_the_inference_takes_a_string_for_a_field_of_several_types() -> None:
    rows = payloads({"id": 1, "n": 5}, {"id": 2, "n": "five"}, {"id": 3, "n": 2**70})
    inference = payload.PayloadInference("route", "doc", lenient=True)
    (out,) = list(inference(iter([rows])))
    columns = pickle.loads(out.column("columns")[0].as_py())
    assert columns == {"id": pa.int64(), "n": pa.string()}
    assert payload.merge_columns([{"n": pa.int64()}, {"n": pa.string()}], "db.t", lenient=True).field("n").type == pa.string()
    with pytest.raises(payload.PayloadTypeError):
        list(payload.PayloadInference("route", "doc")(iter([rows])))


def connect_schema(*fields: dict[str, object]) -> str:
    """A Debezium envelope's Connect schema (JsonConverter schemas.enable) whose ``after`` struct has ``fields``."""
    return json.dumps({"type": "struct", "fields": [{"type": "struct", "fields": list(fields), "field": "after"}]})


def test_a_number_with_more_digits_than_a_decimal_column_holds_does_not_fit() -> None:
    """Before: 12.345 into decimal(10,2) became 12.35 and 7.5 into decimal(10,0) 8 (the float-to-decimal cast rounds;
    the exactness check had no decimal case), also inside a struct; strings were refused."""
    target = pa.schema([("a", pa.decimal128(10, 2)), ("z", pa.decimal128(10, 0)), ("s", pa.struct([("d", pa.decimal128(5, 1))]))])
    fits = payloads({"a": 12.30, "z": 7.0, "s": {"d": 1.5}}, {"a": 7, "z": "12", "s": {"d": 9999.9}}, {"a": "-0.10", "z": -0.0})
    assert payload.expand(fits, "doc", target, "db.t").to_pylist() == [
        {"a": Decimal("12.30"), "z": Decimal("7"), "s": {"d": Decimal("1.5")}},
        {"a": Decimal("7.00"), "z": Decimal("12"), "s": {"d": Decimal("9999.9")}},
        {"a": Decimal("-0.10"), "z": Decimal("0"), "s": None},
    ]
    rows = payloads(
        {"a": 12.345}, {"z": 7.5}, {"a": 123456789.5}, {"a": "12.345"}, {"s": {"d": 0.25}}, {"a": 1e300}, {"a": "NaN"}
    )
    out, misfits = payload.expand_fitting(rows, "doc", target, "db.t")
    assert out.num_rows == 0
    assert [(m.row, m.column) for m in misfits] == [(0, "a"), (1, "z"), (2, "a"), (3, "a"), (4, "s"), (5, "a"), (6, "a")]
    assert "holds 12.345, which has 3 digit(s) after the point, more than the column's scale (2)" in misfits[0].message
    assert "holds 123456789.5, which has 9 digit(s) before the point, more than the column's 8" in misfits[2].message
    with pytest.raises(SchemaMismatchError, match=r"table db\.t, column 'z' \(decimal128\(10, 0\)\): a payload holds 7\.5"):
        payload.expand(payloads({"z": 7.5}), "doc", target, "db.t")


def test_an_integer_into_a_temporal_column_has_no_unit_and_is_refused() -> None:
    """Before: pyarrow read an integer in the column's unit: io.debezium.time.Timestamp's milliseconds as microseconds
    (2023-11-14 became 1970-01-20), days into a date column; now refused naming the fix."""
    target = pa.schema([("at", pa.timestamp("us")), ("day", pa.date32()), ("t", pa.time64("us")), ("l", pa.list_(pa.date32()))])
    for doc, column in (({"at": 1_700_000_000_000}, "at"), ({"day": 19_000}, "day"), ({"t": 5}, "t"), ({"l": [1]}, "l")):
        with pytest.raises(SchemaMismatchError, match=rf"table db\.t, column '{column}'.*a payload holds"):
            payload.expand(payloads(doc), "doc", target, "db.t")
    with pytest.raises(SchemaMismatchError, match=r"no unit.*schemas\.enable=true.*time\.precision\.mode=isostring"):
        payload.expand(payloads({"at": 1}), "doc", target, "db.t")
    ok = payload.expand(payloads({"at": "2023-11-14T22:13:20.123", "day": "2023-11-14"}), "doc", target, "db.t")
    assert ok.to_pylist() == [{"at": datetime(2023, 11, 14, 22, 13, 20, 123000), "day": date(2023, 11, 14), "t": None, "l": None}]


def test_a_connect_value_that_does_not_decode_is_a_misfit_never_a_crash() -> None:
    """Before: a Decimal that is no base64 raised a bare binascii.Error out of the inference and the expansion, bytes
    without their padding were decoded into other bytes, a PostgreSQL infinity timestamp raised OverflowError."""
    schema = connect_schema(
        {
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "2", "connect.decimal.precision": "10"},
            "field": "d",
        },
        {"type": "bytes", "field": "b"},
        {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "field": "at"},
        {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "field": "z"},
        {"type": "double", "field": "x"},
    )
    docs = [{"d": "AQ==", "b": "AAE=", "at": 0, "z": "2024-01-01T00:00:00Z", "x": "NaN"}]
    docs += [{"d": "not base64!"}, {"b": "AAE"}, {"at": 9223372036825200000}, {"z": "noon"}, {"x": "many"}]
    batch = pa.record_batch({"route": ["db.t"] * len(docs), "doc": [json.dumps(d) for d in docs], "s": [schema] * len(docs)})
    (inferred,) = list(payload.PayloadInference("route", "doc", schema_column="s")(iter([batch])))
    columns = pickle.loads(inferred.column("columns")[0].as_py())
    target = pa.schema([pa.field(n, t) for n, t in columns.items()])
    out, misfits = payload.expand_fitting(batch, "doc", target, "db.t", schema_column="s")
    assert out.num_rows == 1 and out.column("d").to_pylist() == [Decimal("0.01")]
    assert [(m.row, m.column) for m in misfits] == [(1, "d"), (2, "b"), (3, "at"), (4, "z"), (5, "x")]
    assert "holds 'not base64!' (org.apache.kafka.connect.data.Decimal: " in misfits[0].message
    assert "beyond the range of a timestamp" in misfits[2].message
    with pytest.raises(SchemaMismatchError, match=r"table db\.t, column 'd' .*'not base64!'"):
        payload.expand(batch, "doc", target, "db.t", schema_column="s")


def test_connect_decimals_above_38_digits_are_their_exact_text() -> None:
    """Before: decimal128(65, 30) raised pyarrow's bare "precision should be between 1 and 38"; a decimal(38,10)'s
    32-digit value was rounded to 28 digits by Decimal.scaleb."""
    import base64

    def b64(n: int) -> str:
        return base64.b64encode(n.to_bytes(max(1, (n.bit_length() + 8) // 8), "big", signed=True)).decode()

    dec = "org.apache.kafka.connect.data.Decimal"
    schema = connect_schema(
        {"type": "bytes", "name": dec, "parameters": {"scale": "30", "connect.decimal.precision": "65"}, "field": "big"},
        {"type": "bytes", "name": dec, "parameters": {"scale": "2"}, "field": "free"},
        {
            "type": "struct",
            "name": "io.debezium.data.VariableScaleDecimal",
            "field": "var",
            "fields": [{"type": "int32", "field": "scale"}, {"type": "bytes", "field": "value"}],
        },
        {"type": "bytes", "name": dec, "parameters": {"scale": "10", "connect.decimal.precision": "38"}, "field": "wide"},
    )
    doc = {"big": b64(-(10**64) - 7), "free": b64(12345), "var": {"scale": -2, "value": b64(5)}, "wide": b64(10**37 + 3)}
    batch = pa.record_batch({"route": ["db.t"], "doc": [json.dumps(doc)], "s": [schema]})
    (inferred,) = list(payload.PayloadInference("route", "doc", schema_column="s")(iter([batch])))
    columns = pickle.loads(inferred.column("columns")[0].as_py())
    assert columns == {"big": pa.string(), "free": pa.string(), "var": pa.string(), "wide": pa.decimal128(38, 10)}
    target = pa.schema([pa.field(n, t) for n, t in columns.items()])
    assert payload.expand(batch, "doc", target, "db.t", schema_column="s").to_pylist() == [
        {
            "big": "-" + "1" + "0" * 34 + "." + "0" * 29 + "7",
            "free": "123.45",
            "var": "500",
            "wide": Decimal("1000000000000000000000000000.0000000003"),
        }
    ]
    # into an existing decimal column: each value cast exactly, or refused naming it
    narrow = pa.schema([("free", pa.decimal128(5, 2)), ("big", pa.decimal128(38, 2))])
    out, misfits = payload.expand_fitting(batch, "doc", narrow, "db.t", schema_column="s")
    assert out.num_rows == 0 and [(m.row, m.column) for m in misfits] == [(0, "big")]


def test_a_source_type_widening_joins_the_types_and_marks_the_fields_for_merge_schema() -> None:
    """A batch holding records before and after ALTER COLUMN ... TYPE bigint (Connect int32, then int64): before,
    "two JSON types that no one column holds: int32 and int64"; now one type, Iceberg's promotion, and the field marked
    wide (Found.wide: a narrower column of an existing table is widened with merge-schema). A JSON integer marks its
    field only beyond 32 bits."""
    old = connect_schema(
        {"type": "int32", "field": "id"},
        {"type": "float", "field": "f"},
        {
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "2", "connect.decimal.precision": "10"},
            "field": "d",
        },
    )
    new = connect_schema(
        {"type": "int64", "field": "id"},
        {"type": "double", "field": "f"},
        {
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "2", "connect.decimal.precision": "20"},
            "field": "d",
        },
    )
    batch = pa.record_batch(
        {
            "route": ["db.t"] * 4,
            "doc": [
                json.dumps(d)
                for d in (
                    {"id": 1, "n": 1, "f": None, "d": None},
                    {"id": 2**40, "n": 2**40, "f": 1.5, "d": None},
                    {"id": 3, "small": 5},
                    {"id": 4, "n": None},
                )
            ],
            "s": [old, new, None, None],
        }
    )
    (inferred,) = list(payload.PayloadInference("route", "doc", schema_column="s")(iter([batch])))
    columns = pickle.loads(inferred.column("columns")[0].as_py())
    found = pickle.loads(inferred.column("found")[0].as_py())
    assert columns == {"id": pa.int64(), "f": pa.float64(), "d": pa.decimal128(20, 2), "n": pa.int64(), "small": pa.int64()}
    assert found.wide == {"id", "f", "d", "n"}  # "small" only ever held 5
    merged = payload.merge_columns([columns], "db.t", wide=found.wide)
    assert payload.wide_fields(merged) == {"id", "f", "d", "n"}
    assert payload.unify(pa.decimal128(10, 2), pa.decimal128(12, 2), "x") == pa.decimal128(12, 2)
    with pytest.raises(payload.PayloadTypeError):
        payload.unify(pa.decimal128(10, 2), pa.decimal128(10, 3), "x")  # Iceberg keeps a decimal's scale
    # without merge-schema the int column keeps its type: a value beyond it names both types and the option
    with pytest.raises(
        SchemaMismatchError,
        match=r"column 'id' \(int32\).*1099511627776, which is beyond an int.*merge-schema=true widens the column to long",
    ):
        payload.expand(
            batch,
            "doc",
            pa.schema([(n, t) for n, t in columns.items() if n != "id"] + [("id", pa.int32())]),
            "db.t",
            schema_column="s",
        )
