#!/usr/bin/python3
"""Writes the safetensors inputs that the reader must reject, and the seed
corpus of the safetensors fuzzer.

Each reject file is named STATUS--what.safetensors, STATUS being the
pulse_status the reader must return (test_safetensors.c checks it).
Run from anywhere: /usr/bin/python3 tests/codec/reject/make_safetensors_rejects.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
REJECT_DIR = os.path.join(HERE, "safetensors")
CORPUS_DIR = os.path.join(HERE, "..", "..", "fuzz", "corpus", "safetensors")


def st(header, data=b"", pad=True):
    """A safetensors file from a header (str or bytes) and data bytes."""
    h = header.encode("utf-8") if isinstance(header, str) else header
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def t(name, dtype, shape, begin, end):
    return '"%s":{"dtype":"%s","shape":%s,"data_offsets":[%s,%s]}' % (
        name, dtype, shape, begin, end)


ONE = t("a", "F32", "[1]", 0, 4)

REJECTS = {
    "PULSE_ERR_TRUNCATED--empty-file": b"",
    "PULSE_ERR_TRUNCATED--shorter-than-8-bytes": b"\x02\x00\x00",
    "PULSE_ERR_TRUNCATED--header-past-end": struct.pack("<Q", 100) + b"{}",
    "PULSE_ERR_OVERFLOW--header-over-100mb":
        struct.pack("<Q", 100000001) + b"{}      ",
    "PULSE_ERR_OVERFLOW--header-length-u64-max":
        struct.pack("<Q", 2**64 - 1) + b"{}",
    "PULSE_ERR_JSON--empty-header": struct.pack("<Q", 0),
    "PULSE_ERR_JSON--header-not-json": st("{not json}"),
    "PULSE_ERR_JSON--header-is-array": st("[]"),
    "PULSE_ERR_JSON--header-is-string": st('"{}"'),
    "PULSE_ERR_JSON--header-leading-space": st(" {}"),
    "PULSE_ERR_JSON--header-trailing-garbage": st("{} x"),
    "PULSE_ERR_JSON--header-trailing-comma": st("{%s,}" % ONE, b"\0" * 4),
    "PULSE_ERR_JSON--header-nul-padding": st(b"{}\0\0\0\0\0\0", pad=False),
    "PULSE_ERR_JSON--header-unterminated": st('{"a":{"dtype":"F32"'),
    "PULSE_ERR_JSON--entry-not-object": st('{"a":[1]}'),
    "PULSE_ERR_JSON--missing-dtype":
        st('{"a":{"shape":[1],"data_offsets":[0,4]}}', b"\0" * 4),
    "PULSE_ERR_JSON--missing-shape":
        st('{"a":{"dtype":"F32","data_offsets":[0,4]}}', b"\0" * 4),
    "PULSE_ERR_JSON--missing-data-offsets":
        st('{"a":{"dtype":"F32","shape":[1]}}', b"\0" * 4),
    "PULSE_ERR_JSON--dtype-not-string": st("{%s}" % t("a", "F32", "[1]", 0, 4)
                                           .replace('"F32"', "32"), b"\0" * 4),
    "PULSE_ERR_JSON--shape-not-array": st("{%s}" % t("a", "F32", "1", 0, 4),
                                          b"\0" * 4),
    "PULSE_ERR_JSON--shape-negative": st("{%s}" % t("a", "F32", "[-1]", 0, 4),
                                         b"\0" * 4),
    "PULSE_ERR_JSON--shape-fraction": st("{%s}" % t("a", "F32", "[1.5]", 0, 4),
                                         b"\0" * 4),
    "PULSE_ERR_JSON--shape-exponent": st("{%s}" % t("a", "F32", "[1e0]", 0, 4),
                                         b"\0" * 4),
    "PULSE_ERR_JSON--field-repeated":
        st('{"a":{"dtype":"F32","dtype":"F16","shape":[1],'
           '"data_offsets":[0,4]}}', b"\0" * 4),
    "PULSE_ERR_JSON--metadata-value-number":
        st('{"__metadata__":{"step":1},%s}' % ONE, b"\0" * 4),
    "PULSE_ERR_JSON--metadata-value-object":
        st('{"__metadata__":{"x":{}},%s}' % ONE, b"\0" * 4),
    "PULSE_ERR_JSON--metadata-not-object":
        st('{"__metadata__":"step",%s}' % ONE, b"\0" * 4),
    "PULSE_ERR_JSON--metadata-value-with-nul":
        st('{"__metadata__":{"x":"a\\u0000b"},%s}' % ONE, b"\0" * 4),
    "PULSE_ERR_JSON--name-with-nul":
        st("{%s}" % t("a\\u0000b", "F32", "[1]", 0, 4), b"\0" * 4),
    "PULSE_ERR_JSON--name-invalid-utf8":
        st(b'{"\xc0\x80":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
           b"\0" * 4),
    "PULSE_ERR_JSON--name-encoded-surrogate":
        st(b'{"\xed\xa0\x80":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
           b"\0" * 4),
    "PULSE_ERR_JSON--name-lone-surrogate-escape":
        st("{%s}" % t("\\ud800", "F32", "[1]", 0, 4), b"\0" * 4),
    "PULSE_ERR_JSON--name-control-character":
        st("{%s}" % t("a\tb", "F32", "[1]", 0, 4), b"\0" * 4),
    "PULSE_ERR_JSON--nesting-too-deep":
        st('{"__metadata__":{"x":%s%s}}' % ("[" * 100, "]" * 100)),
    "PULSE_ERR_DTYPE--dtype-f64": st("{%s}" % t("a", "F64", "[1]", 0, 8),
                                     b"\0" * 8),
    "PULSE_ERR_DTYPE--dtype-i64": st("{%s}" % t("a", "I64", "[1]", 0, 8),
                                     b"\0" * 8),
    "PULSE_ERR_DTYPE--dtype-lowercase": st("{%s}" % t("a", "bf16", "[1]", 0, 2),
                                           b"\0" * 2),
    "PULSE_ERR_DTYPE--dtype-unknown": st("{%s}" % t("a", "Q7", "[1]", 0, 1),
                                         b"\0"),
    "PULSE_ERR_UNSUPPORTED--nine-dimensions":
        st("{%s}" % t("a", "F32", "[1,1,1,1,1,1,1,1,1]", 0, 4), b"\0" * 4),
    "PULSE_ERR_OVERFLOW--dimension-over-u64":
        st("{%s}" % t("a", "F32", "[18446744073709551616]", 0, 4), b"\0" * 4),
    "PULSE_ERR_OVERFLOW--numel-overflows":
        st("{%s}" % t("a", "F32", "[4294967296,4294967296]", 0, 4), b"\0" * 4),
    "PULSE_ERR_OVERFLOW--bytes-overflow":
        st("{%s}" % t("a", "F32", "[4611686018427387904]", 0, 4), b"\0" * 4),
    "PULSE_ERR_OFFSETS--offsets-fraction":
        st("{%s}" % t("a", "F32", "[1]", "0.0", 4), b"\0" * 4),
    "PULSE_ERR_OFFSETS--offsets-strings":
        st("{%s}" % t("a", "F32", "[1]", '"0"', '"4"'), b"\0" * 4),
    "PULSE_ERR_OFFSETS--offsets-negative":
        st("{%s}" % t("a", "F32", "[1]", -4, 0), b"\0" * 4),
    "PULSE_ERR_OFFSETS--offsets-three":
        st('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}',
           b"\0" * 4),
    "PULSE_ERR_OFFSETS--offsets-not-array":
        st('{"a":{"dtype":"F32","shape":[1],"data_offsets":4}}', b"\0" * 4),
    "PULSE_ERR_OFFSETS--offset-over-u64":
        st("{%s}" % t("a", "F32", "[1]", 0, 18446744073709551620), b"\0" * 4),
    "PULSE_ERR_OFFSETS--end-before-begin":
        st("{%s}" % t("a", "F32", "[0]", 4, 0), b"\0" * 4),
    "PULSE_ERR_OFFSETS--beyond-data": st("{%s}" % t("a", "F32", "[1]", 0, 4),
                                         b"\0" * 3),
    "PULSE_ERR_OFFSETS--gap":
        st("{%s,%s}" % (t("a", "F32", "[1]", 0, 4), t("b", "F32", "[1]", 8, 12)),
           b"\0" * 12),
    "PULSE_ERR_OFFSETS--overlap":
        st("{%s,%s}" % (t("a", "F32", "[2]", 0, 8), t("b", "F32", "[1]", 4, 8)),
           b"\0" * 8),
    "PULSE_ERR_OFFSETS--same-range-twice":
        st("{%s,%s}" % (t("a", "F32", "[1]", 0, 4), t("b", "F32", "[1]", 0, 4)),
           b"\0" * 4),
    "PULSE_ERR_OFFSETS--not-starting-at-zero":
        st("{%s}" % t("a", "F32", "[1]", 4, 8), b"\0" * 8),
    "PULSE_ERR_OFFSETS--empty-tensor-inside-another":
        st("{%s,%s}" % (t("a", "F32", "[2]", 0, 8), t("b", "F32", "[0]", 4, 4)),
           b"\0" * 8),
    "PULSE_ERR_SIZE_MISMATCH--bytes-not-numel-times-size":
        st("{%s}" % t("a", "F32", "[2]", 0, 4), b"\0" * 4),
    "PULSE_ERR_SIZE_MISMATCH--bf16-sized-as-f32":
        st("{%s}" % t("a", "BF16", "[2]", 0, 8), b"\0" * 8),
    "PULSE_ERR_SIZE_MISMATCH--zero-size-with-bytes":
        st("{%s}" % t("a", "F16", "[3,0]", 0, 2), b"\0" * 2),
    "PULSE_ERR_TRAILING--bytes-after-last-tensor":
        st("{%s}" % t("a", "F32", "[1]", 0, 4), b"\0" * 5),
    "PULSE_ERR_TRAILING--data-without-tensors": st("{}", b"\0"),
    "PULSE_ERR_DUPLICATE--tensor-name-twice":
        st("{%s,%s}" % (t("a", "F32", "[1]", 0, 4), t("a", "F32", "[1]", 4, 8)),
           b"\0" * 8),
    "PULSE_ERR_DUPLICATE--metadata-twice":
        st('{"__metadata__":{},"__metadata__":{},%s}' % ONE, b"\0" * 4),
    "PULSE_ERR_DUPLICATE--metadata-key-twice":
        st('{"__metadata__":{"k":"1","k":"2"},%s}' % ONE, b"\0" * 4),
}

VALID = {
    "valid-empty": st("{}"),
    "valid-one-bf16": st("{%s}" % t("w", "BF16", "[2,2]", 0, 8),
                         bytes(range(8))),
    "valid-three-dtypes-metadata":
        st('{"__metadata__":{"step":"7","format":"pt"},%s,%s,%s}' % (
            t("a", "F32", "[2]", 0, 8), t("b", "BF16", "[1,3]", 8, 14),
            t("c", "F16", "[1]", 14, 16)), bytes(range(16))),
    "valid-scalar-and-empty":
        st("{%s,%s,%s}" % (t("s", "F32", "[]", 0, 4), t("z", "BF16", "[0,5]", 4, 4),
                           t("\\u00e9\\ud83d\\ude00", "F16", "[0]", 4, 4)),
           b"\x00\x00\x80\x3f"),
    "valid-unpadded-header": st("{%s}" % t("x", "F16", "[3]", 0, 6),
                                b"\x01\x02\x03\x04\x05\x06", pad=False),
}


def main():
    os.makedirs(REJECT_DIR, exist_ok=True)
    os.makedirs(CORPUS_DIR, exist_ok=True)
    for name, data in REJECTS.items():
        with open(os.path.join(REJECT_DIR, name + ".safetensors"), "wb") as f:
            f.write(data)
    for name, data in VALID.items():
        with open(os.path.join(CORPUS_DIR, name + ".safetensors"), "wb") as f:
            f.write(data)
    # A few rejected inputs seed the fuzzer too.
    for name in ("PULSE_ERR_OFFSETS--gap", "PULSE_ERR_DUPLICATE--tensor-name-twice",
                 "PULSE_ERR_JSON--name-invalid-utf8",
                 "PULSE_ERR_OVERFLOW--numel-overflows",
                 "PULSE_ERR_TRAILING--bytes-after-last-tensor"):
        short = name.split("--", 1)[1]
        with open(os.path.join(CORPUS_DIR, "invalid-" + short + ".safetensors"),
                  "wb") as f:
            f.write(REJECTS[name])


if __name__ == "__main__":
    main()
