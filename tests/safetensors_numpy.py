"""Reads a safetensors file with numpy alone and prints one line per tensor:
   name dtype shape sum   (sum in float64, to 17 digits)
The whole format in 20 lines: an 8-byte little-endian header length, a JSON header naming
each tensor's dtype, shape and byte range, then the raw little-endian data."""
import json, struct, sys
import numpy as np

def load(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = np.frombuffer(data[b:end], dtype=np.uint16 if e["dtype"] == "BF16" else
                            {"F32": "<f4", "F16": "<f2", "I32": "<i4", "I64": "<i8", "U8": "u1"}[e["dtype"]])
        if e["dtype"] == "BF16":  # bf16 is the top half of an f32
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        out[name] = (e["dtype"], raw.reshape(e["shape"]))
    return header.get("__metadata__", {}), out

if __name__ == "__main__":
    meta, tensors = load(sys.argv[1])
    for k, v in sorted(meta.items()):
        print("meta", k, v)
    for name, (dt, a) in tensors.items():
        print(name, dt, "x".join(map(str, a.shape)) or "scalar", repr(float(a.astype(np.float64).sum())))
