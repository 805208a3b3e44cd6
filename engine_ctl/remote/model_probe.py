"""The model probe: runs on a host as one process (`python3 -I - ARGS_JSON`), stdlib only. For each path it
reports what the files say: a GGUF file's metadata (key/values, not the tokenizer) and where its tensor data
starts, or a checkpoint directory's config.json and the index's total_size. Prints one JSON document."""

import json
import os
import struct
import sys

# GGUF value types (ggml's gguf.h): 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array,
# 10 u64, 11 i64, 12 f64
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class Reader:
    def __init__(self, f):
        self.f = f

    def take(self, fmt):
        size = struct.calcsize(fmt)
        data = self.f.read(size)
        if len(data) != size:
            raise ValueError("truncated GGUF file")
        return struct.unpack(fmt, data)[0]

    def string(self):
        n = self.take("<Q")
        if n > 1 << 24:
            raise ValueError("implausible string length")
        return self.f.read(n).decode("utf-8", "replace")

    def value(self, vtype, keep):
        if vtype in SCALARS:
            return self.take(SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            item_type = self.take("<I")
            count = self.take("<Q")
            if not keep:  # skip the tokenizer's large arrays without building them
                if item_type in SCALARS:
                    self.f.seek(count * struct.calcsize(SCALARS[item_type]), 1)
                else:
                    for _ in range(count):
                        self.value(item_type, False)
                return None
            return [self.value(item_type, True) for _ in range(min(count, 4096))]
        raise ValueError("unknown GGUF value type %d" % vtype)


def gguf(path):
    with open(path, "rb") as f:
        r = Reader(f)
        if f.read(4) != b"GGUF":
            return {"error": "not a GGUF file (bad magic)"}
        version = r.take("<I")
        n_tensors = r.take("<Q")
        n_kv = r.take("<Q")
        fields = {}
        for _ in range(n_kv):
            key = r.string()
            vtype = r.take("<I")
            keep = not key.startswith("tokenizer.")
            value = r.value(vtype, keep)
            if keep:
                fields[key] = value
        for _ in range(n_tensors):
            r.string()
            n_dims = r.take("<I")
            f.seek(8 * n_dims + 4 + 8, 1)
        alignment = int(fields.get("general.alignment", 32))
        offset = f.tell()
        offset += (alignment - offset % alignment) % alignment
        size = os.path.getsize(path)
        return {"format": "gguf", "version": version, "fields": fields, "size": size, "data_bytes": size - offset}


def checkpoint(path):
    out = {"format": "safetensors"}  # type: dict[str, object]
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        out["config"] = json.load(f)
    index = os.path.join(path, "model.safetensors.index.json")
    total = None
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            total = (json.load(f).get("metadata") or {}).get("total_size")
    if total is None:
        total = sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path) if n.endswith(".safetensors"))
    out["data_bytes"] = total
    return out


def main():
    out = {}
    for path in json.loads(sys.argv[1]):
        try:
            if os.path.isdir(path):
                out[path] = checkpoint(path)
            elif os.path.isfile(path):
                out[path] = gguf(path)
            else:
                out[path] = {"missing": True}
        except (OSError, ValueError, struct.error) as exc:
            out[path] = {"error": str(exc)}
    sys.stdout.write(json.dumps(out))


main()
