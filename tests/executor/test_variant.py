"""A VARIANT payload's JSON text made without Spark (lakesink.executor.variant), on values encoded by pyspark's own
Variant encoder; the text equals Spark's ``to_json`` of the same values (tests/sink/test_variant_payload_spark.py holds
it against the JVM for every primitive type)."""

from __future__ import annotations

import json
import struct

import pyarrow as pa
import pytest
from pyspark.sql.variant_utils import VariantUtils

from lakesink.errors import SchemaMismatchError
from lakesink.executor import variant


def encoded(text: str) -> tuple[bytes, bytes]:
    return VariantUtils.parse_json(text)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ('{"b":1,"a":[1,2.5,null,true,false],"c":{"z":"x","y":-3}}', '{"a":[1,2.5,null,true,false],"b":1,"c":{"y":-3,"z":"x"}}'),
        ("12345678901234567890123", "12345678901234567890123"),  # beyond a long: a decimal of scale 0
        ("1.50", "1.5"),  # a decimal without its trailing zeros
        ("[1000.00,0.10,-0.001,0.0]", "[1000,0.1,-0.001,0]"),
        ("1e20", "1.0E20"),  # a double, as Java writes it
        ("-1e-5", "-1.0E-5"),
        ('"tab\\tquote\\"slash/ \\u0001 é ✓"', '"tab\\tquote\\"slash/ \\u0001 é ✓"'),
        ('"' + "x" * 100 + '"', '"' + "x" * 100 + '"'),  # a long string
        ("[]", "[]"),
        ("{}", "{}"),
        ("null", "null"),
    ],
)
def test_a_variant_value_is_written_as_sparks_to_json_writes_it(text: str, want: str) -> None:
    assert variant.to_json(*encoded(text)) == want
    assert json.loads(want) == json.loads(text)


def test_java_number_text() -> None:
    cases = [(1.0, "1.0"), (100.0, "100.0"), (0.001, "0.001"), (1234567.0, "1234567.0"), (1e7, "1.0E7"), (0.5e-3, "5.0E-4")]
    cases += [(-0.0, "-0.0"), (float("nan"), "NaN"), (float("-inf"), "-Infinity"), (123.456, "123.456")]
    for value, want in cases:
        assert variant._java_number(value, float32=False) == want, value
    assert variant._java_number(struct.unpack("<f", struct.pack("<f", 1.1))[0], float32=True) == "1.1"


def test_a_variant_column_becomes_text_and_a_malformed_value_is_a_loud_error() -> None:
    value, metadata = encoded('{"id":1}')
    t = pa.struct([pa.field("value", pa.binary(), False), pa.field("metadata", pa.binary(), False, {b"variant": b"true"})])
    assert variant.is_variant(t)
    assert not variant.is_variant(pa.struct([pa.field("value", pa.binary()), pa.field("metadata", pa.binary())]))
    column = pa.StructArray.from_arrays(
        [pa.array([value, value], pa.binary()), pa.array([metadata, metadata], pa.binary())],
        fields=list(t),
        mask=pa.array([False, True]),
    )
    assert variant.json_texts(column).to_pylist() == ['{"id":1}', None]
    with pytest.raises(SchemaMismatchError, match="a VARIANT payload is malformed"):
        variant.to_json(value[:3], metadata)
