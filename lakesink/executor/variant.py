"""Option ``payload`` naming a VARIANT column (Spark 4): each value as the JSON text Spark's ``to_json`` gives it.

Executor side, plain Python over Arrow. Spark hands a VARIANT to Python as a struct of two binaries, ``value`` and
``metadata`` (the Variant binary encoding, whose spec is Parquet's ``VariantEncoding.md``). format("lakesink")'s writers
get no Spark: :func:`json_texts` decodes the encoding here, and writes each value as Spark's ``to_json(column,
map('timeZone', 'UTC'))`` writes it, character for character, so that both entry points read the same text
(foreach_batch has Spark's ``to_json`` make it; tests/sink/test_variant_payload_spark.py holds the two equal):

- objects with their fields in the encoding's order (sorted by name), arrays, strings JSON-escaped as Jackson does
  (control characters as ``\\u00XX`` in upper case, other characters as they are);
- integers as digits; doubles and floats as Java's ``Double.toString`` / ``Float.toString`` (``1.0``, ``1.0E20``,
  ``NaN``); decimals as plain digits without trailing zeros (``1.50`` is ``1.5``, a double once parsed; ``1000.00`` is
  ``1000``, an integer);
- a date as ``"2024-01-31"``; a timestamp as ``"2024-01-31 12:00:00.5+00:00"`` (UTC; fraction digits only as needed),
  one without time zone without the offset; binary as base64 text; a UUID as its canonical text.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import struct
import uuid

import numpy as np
import pyarrow as pa

from lakesink.errors import SchemaMismatchError

_EPOCH_DAY = dt.date(1970, 1, 1)
_EPOCH = dt.datetime(1970, 1, 1)
_CONTROL = re.compile(r"\\u00([0-9a-f]{2})")


def is_variant(t: pa.DataType) -> bool:
    """Whether an Arrow type is Spark's VARIANT (a struct of ``value`` and ``metadata``, the latter tagged)."""
    if not pa.types.is_struct(t) or t.num_fields != 2 or {f.name for f in t} != {"value", "metadata"}:
        return False
    return (t.field("metadata").metadata or {}).get(b"variant") == b"true"


def json_texts(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A VARIANT column's values as their JSON text (a null value: null)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    values = column.field("value").to_pylist()
    metadata = column.field("metadata").to_pylist()
    valid = column.is_valid().to_pylist()
    out = [to_json(v, m) if ok and v is not None else None for v, m, ok in zip(values, metadata, valid, strict=True)]
    return pa.array(out, pa.string())


def to_json(value: bytes, metadata: bytes) -> str:
    """One VARIANT value as Spark's ``to_json`` writes it (time zone UTC)."""
    try:
        return _Reader(value, _keys(metadata)).json(0)
    except (IndexError, OverflowError, struct.error, ValueError) as e:
        raise SchemaMismatchError(f"a VARIANT payload is malformed ({type(e).__name__}: {e})") from None


def _keys(metadata: bytes) -> list[str]:
    header = metadata[0]
    if header & 0x0F != 1:
        raise ValueError(f"variant metadata version {header & 0x0F}, not 1")
    size = ((header >> 6) & 0x3) + 1
    count = int.from_bytes(metadata[1 : 1 + size], "little")
    offsets = [int.from_bytes(metadata[1 + size * (i + 1) : 1 + size * (i + 2)], "little") for i in range(count + 1)]
    start = 1 + size * (count + 2)
    return [metadata[start + offsets[i] : start + offsets[i + 1]].decode("utf-8") for i in range(count)]


def _string(text: str) -> str:
    """JSON string as Jackson writes it: ``json.dumps`` without ASCII escapes, control characters' hex in upper case."""
    return _CONTROL.sub(lambda m: "\\u00" + m.group(1).upper(), json.dumps(text, ensure_ascii=False))


def _java_number(value: float, float32: bool) -> str:
    """Java's ``Double.toString`` (``Float.toString`` when ``float32``) of a value: its shortest digits, plain between
    10^-3 and 10^7, else ``d.dddE<n>``."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if str(value).startswith("-") else "0.0"
    scientific = np.format_float_scientific(np.float32(value) if float32 else value, unique=True, trim="-")
    mantissa, exponent = scientific.split("e")
    sign = "-" if mantissa.startswith("-") else ""
    digits = mantissa.lstrip("-").replace(".", "")
    exp = int(exponent)
    if 1e-3 <= abs(value) < 1e7:
        point = exp + 1
        if point <= 0:
            whole, fraction = "0", "0" * -point + digits
        elif point >= len(digits):
            whole, fraction = digits + "0" * (point - len(digits)), "0"
        else:
            whole, fraction = digits[:point], digits[point:]
        return f"{sign}{whole}.{fraction or '0'}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{exp}"


def _plain_decimal(unscaled: int, scale: int) -> str:
    """Java's ``stripTrailingZeros().toPlainString()`` of a decimal: ``1.50`` is ``1.5``, ``1000.00`` is ``1000``."""
    while scale > 0 and unscaled % 10 == 0:
        unscaled //= 10
        scale -= 1
    digits = str(abs(unscaled))
    sign = "-" if unscaled < 0 else ""
    if scale == 0:
        return sign + digits
    digits = digits.rjust(scale + 1, "0")
    return f"{sign}{digits[:-scale]}.{digits[-scale:]}"


def _timestamp(micros: int, zoned: bool) -> str:
    moment = _EPOCH + dt.timedelta(microseconds=micros)
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    if moment.year < 1000:  # strftime does not pad years before 1000 on every platform
        text = f"{moment.year:04d}{text[text.index('-') :]}"
    if moment.microsecond:
        text += "." + f"{moment.microsecond:06d}".rstrip("0")
    return text + ("+00:00" if zoned else "")


class _Reader:
    def __init__(self, value: bytes, keys: list[str]):
        self.value = value
        self.keys = keys

    def _int(self, pos: int, size: int, signed: bool = False) -> int:
        if pos + size > len(self.value):
            raise IndexError("a variant value ends early")
        return int.from_bytes(self.value[pos : pos + size], "little", signed=signed)

    def json(self, pos: int) -> str:
        header = self.value[pos]
        basic, info = header & 0x3, header >> 2
        if basic == 1:  # short string
            return _string(self.value[pos + 1 : pos + 1 + info].decode("utf-8"))
        if basic == 2:  # object
            large, id_size, offset_size = (info >> 4) & 1, ((info >> 2) & 0x3) + 1, (info & 0x3) + 1
            count_size = 4 if large else 1
            count = self._int(pos + 1, count_size)
            ids = pos + 1 + count_size
            offsets = ids + count * id_size
            data = offsets + (count + 1) * offset_size
            fields = []
            for i in range(count):
                key = self.keys[self._int(ids + i * id_size, id_size)]
                fields.append(_string(key) + ":" + self.json(data + self._int(offsets + i * offset_size, offset_size)))
            return "{" + ",".join(fields) + "}"
        if basic == 3:  # array
            large, offset_size = (info >> 2) & 1, (info & 0x3) + 1
            count_size = 4 if large else 1
            count = self._int(pos + 1, count_size)
            offsets = pos + 1 + count_size
            data = offsets + (count + 1) * offset_size
            items = [self.json(data + self._int(offsets + i * offset_size, offset_size)) for i in range(count)]
            return "[" + ",".join(items) + "]"
        return self._primitive(info, pos + 1)

    def _primitive(self, kind: int, at: int) -> str:
        if kind == 0:
            return "null"
        if kind in (1, 2):
            return "true" if kind == 1 else "false"
        if kind in (3, 4, 5, 6):  # int8, int16, int32, int64
            return str(self._int(at, {3: 1, 4: 2, 5: 4, 6: 8}[kind], signed=True))
        if kind == 7:
            return _java_number(struct.unpack_from("<d", self.value, at)[0], float32=False)
        if kind == 14:
            return _java_number(struct.unpack_from("<f", self.value, at)[0], float32=True)
        if kind in (8, 9, 10):  # decimal4, decimal8, decimal16: a scale byte, then the unscaled value
            scale = self.value[at]
            unscaled = self._int(at + 1, {8: 4, 9: 8, 10: 16}[kind], signed=True)
            return _plain_decimal(unscaled, scale)
        if kind == 11:
            return '"' + (_EPOCH_DAY + dt.timedelta(days=self._int(at, 4, signed=True))).isoformat() + '"'
        if kind in (12, 13):  # timestamp (UTC), timestamp without time zone: microseconds
            return '"' + _timestamp(self._int(at, 8, signed=True), zoned=kind == 12) + '"'
        if kind in (15, 16):  # binary, long string: a 4-byte length, then the bytes
            size = self._int(at, 4)
            data = self.value[at + 4 : at + 4 + size]
            if kind == 16:
                return _string(data.decode("utf-8"))
            return '"' + base64.b64encode(data).decode("ascii") + '"'
        if kind == 20:  # uuid, big-endian
            return '"' + str(uuid.UUID(bytes=bytes(self.value[at : at + 16]))) + '"'
        raise ValueError(f"variant primitive type {kind} is not one lakesink reads")
