#!/usr/bin/env python3
"""Writes the committed seed corpus fuzz/corpus/safetensors/ (small files: valid ones of
every dtype, metadata, empty tensors, and a few near-misses). Re-run to regenerate."""
import json
import os
import struct

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "safetensors")
os.makedirs(out, exist_ok=True)
SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
         "U8": 1, "BOOL": 1, "U16": 2, "U32": 4, "U64": 8}


def st(tensors, metadata=None, pad=True, header_override=None):
    """tensors: [(name, dtype, shape)]; data is a byte ramp."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        size = n * SIZES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + size]}
        data += bytes(i % 251 for i in range(size))
    h = (header_override if header_override is not None else json.dumps(header, separators=(",", ":"))).encode()
    if pad:
        h += b" " * ((8 - (len(h) + 8) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


seeds = {
    "valid_two_f32": st([("a.weight", "F32", [2, 3]), ("a.bias", "F32", [3])]),
    "valid_metadata": st([("w", "F32", [4])], metadata={"format": "pt"}),
    "valid_all_dtypes": st([(f"t_{d.lower()}", d, [2, 2]) for d in SIZES]),
    "valid_scalar_and_empty": st([("scalar", "F32", []), ("empty", "F32", [0, 5]), ("x", "I8", [3])]),
    "valid_empty_header": st([]),
    "valid_unpadded": st([("x", "F16", [3])], pad=False),
    "layer_names": st([("transformer.encoder.layers.0.self_attn.in_proj_weight", "F32", [6, 2]),
                       ("generator.bias", "F32", [2])]),
    "overlap": st([], header_override='{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                                      '"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}') + bytes(16),
    "out_of_range": st([], header_override='{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}') + bytes(8),
    "wrong_span": st([], header_override='{"a":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}}') + bytes(8),
    "not_object": st([], header_override="[1,2,3]"),
    "duplicate_name": st([], header_override='{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                             '"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}') + bytes(2),
    "huge_header_len": struct.pack("<Q", 2**64 - 1) + b"{}",
    "short": b"\x02\x00\x00",
}
for name, data in seeds.items():
    with open(os.path.join(out, name + ".safetensors"), "wb") as f:
        f.write(data)
print(f"wrote {len(seeds)} seeds to {out}")
