"""A GGUF file's metadata (its key/value header) read from the start of a byte stream, so that a pull can refuse a model
from its first few MiB instead of after downloading gigabytes. The `gguf` package reads whole files (a memory map);
this reads only as far as the last key. Big arrays (the tokenizer's tokens and merges) are skipped, their length kept.

    read_metadata(stream) -> {key: value}   (stream: anything with .read(n), e.g. HfFileSystem().open(..., block_size=0))
    MetadataReader(fields): the `.fields[key].contents()` face of gguf.GGUFReader that importer/gguf_file.py reads

Layout (little-endian): b"GGUF", version u32, tensor count u64, key count u64, then per key: a string (u64 length +
UTF-8 bytes), a value type u32 and the value; an array is an element type u32, a count u64 and the elements."""
from __future__ import annotations

import struct

from .errors import ImportRefused

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
KEEP_ARRAY = 64                 # arrays up to this many elements are kept; longer ones become Skipped(count)
MAX_HEADER = 256 * 2**20        # a header longer than this is not a model we can run


class Skipped:
    """A long array that was read past: its element count (len()) without its elements."""

    def __init__(self, count: int):
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"Skipped({self.count})"


class _Stream:
    def __init__(self, f, name: str):
        self.f, self.name, self.pos = f, name, 0

    def read(self, n: int) -> bytes:
        if self.pos + n > MAX_HEADER:
            raise ImportRefused(f"{self.name}: GGUF header longer than {MAX_HEADER // 2**20} MiB")
        out = b""
        while len(out) < n:
            chunk = self.f.read(n - len(out))
            if not chunk:
                raise ImportRefused(f"{self.name}: the GGUF header ends early (a truncated or damaged file)")
            out += chunk
        self.pos += n
        return out

    def skip(self, n: int) -> None:
        while n > 0:
            k = min(n, 1 << 20)
            self.read(k)
            n -= k

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > 1 << 26:
            raise ImportRefused(f"{self.name}: a GGUF string of {n} bytes (a damaged file)")
        return self.read(n).decode("utf-8", errors="replace")


def _value(s: _Stream, kind: int):
    if kind in _SCALARS:
        return s.unpack(_SCALARS[kind])
    if kind == STRING:
        return s.string()
    if kind == ARRAY:
        sub, count = s.unpack("<I"), s.unpack("<Q")
        if count <= KEEP_ARRAY:
            return [_value(s, sub) for _ in range(count)]
        if sub in _SCALARS:
            s.skip(count * struct.calcsize(_SCALARS[sub]))
        elif sub == STRING:
            for _ in range(count):
                s.skip(s.unpack("<Q"))
        else:
            for _ in range(count):
                _value(s, sub)
        return Skipped(count)
    raise ImportRefused(f"{s.name}: unknown GGUF value type {kind} (a damaged file, or a newer GGUF version)")


def read_metadata(f, name: str = "GGUF") -> dict:
    """{key: value} of the GGUF header at the start of stream f (plus "GGUF.version", "GGUF.tensor_count").
    ImportRefused (one line) when it is not a GGUF or ends early."""
    s = _Stream(f, name)
    if s.read(4) != b"GGUF":
        raise ImportRefused(f"{name}: not a GGUF file")
    version = s.unpack("<I")
    if version not in (2, 3):
        raise ImportRefused(f"{name}: GGUF version {version} is not supported (2 or 3)")
    tensors, keys = s.unpack("<Q"), s.unpack("<Q")
    out = {"GGUF.version": version, "GGUF.tensor_count": tensors}
    for _ in range(keys):
        key = s.string()
        out[key] = _value(s, s.unpack("<I"))
    return out


class _Field:
    def __init__(self, value):
        self.value = value

    def contents(self):
        return self.value


class MetadataReader:
    """A metadata dict in the shape importer/gguf_file.py reads a gguf.GGUFReader (`.fields[key].contents()`)."""

    def __init__(self, metadata: dict):
        self.fields = {k: _Field(v) for k, v in metadata.items()}
