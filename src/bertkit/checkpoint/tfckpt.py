"""TensorFlow checkpoints (the "tensor bundle" of `tf.train.Saver` / `tf.train.Checkpoint`) read
without TensorFlow: plain Python and numpy.

A checkpoint `PREFIX` is two kinds of file:

    PREFIX.index                      a LevelDB-format table (SSTable): tensor name -> BundleEntryProto,
                                      and under the empty name a BundleHeaderProto (shards, endianness)
    PREFIX.data-00000-of-00001, ...   the tensors' raw bytes, one after another

The index file: data blocks of sorted key/value entries (each key stored as the length it shares
with the previous key plus the rest), an index block whose values point at the data blocks, and a
48-byte footer (two block handles, padding, the magic number 0xdb4775248b80fb57). Every block is
followed by a type byte (0: plain, 1: snappy, which TensorFlow does not write) and the masked
CRC-32C of block + type byte, which is checked here. Each entry gives the tensor's dtype and
shape, its shard, offset and size in the data files, and the masked CRC-32C of its bytes (checked
on read). Integers are protobuf varints; every error names the file and what is wrong with it.
"""
from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BertkitError


class CheckpointFormatError(BertkitError, ValueError):
    """A TensorFlow checkpoint is missing a file, truncated or corrupt; the message names the file."""


_MAGIC = 0xDB4775248B80FB57
_FOOTER = 48                       # two block handles padded to 40 bytes, then the 8-byte magic
_TRAILER = 5                       # after each block: type byte + masked crc32c

# tensorflow/core/framework/types.proto: DataType -> numpy dtype (the ones that are plain bytes)
_DTYPES = {1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 9: "int64",
           10: "bool", 14: "bfloat16", 17: "uint16", 19: "float16", 22: "uint32", 23: "uint64"}
_DTYPE_NAMES = {7: "string", 8: "complex64", 18: "complex128", 20: "resource", 21: "variant"}


# ---- CRC-32C (Castagnoli), as TensorFlow and LevelDB mask it -----------------------------------------
def _crc_table() -> np.ndarray:
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ np.uint32(0x82F63B78), t >> 1).astype(np.uint32)
    return t


_TABLE = _crc_table()
_TABLE_LIST = [int(x) for x in _TABLE]


def _raw_serial(data: bytes | np.ndarray, crc: int = 0) -> int:
    """The CRC register after `data` from register `crc` (no initial or final inversion)."""
    t = _TABLE_LIST
    for b in bytes(data):
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc


def _apply(matrix: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A GF(2) 32x32 matrix (column i = image of bit i) applied to each uint32 of x."""
    out = np.zeros_like(x)
    for i in range(32):
        out ^= np.where((x >> np.uint32(i)) & np.uint32(1), matrix[i], np.uint32(0))
    return out


@functools.lru_cache(maxsize=256)
def _zeros_matrix(n: int) -> np.ndarray:
    """The linear map 'feed n zero bytes' on the CRC register (n >= 0), by repeated squaring."""
    if n == 0:
        return np.array([1 << i for i in range(32)], dtype=np.uint32)           # identity
    if n == 1:
        return np.array([_raw_serial(b"\0", 1 << i) for i in range(32)], dtype=np.uint32)
    half = _zeros_matrix(n // 2)
    twice = _apply(half, half)
    return _apply(_zeros_matrix(1), twice) if n & 1 else twice


def crc32c(data: bytes | bytearray | np.ndarray) -> int:
    """CRC-32C of `data`. Large inputs run as 16k lanes at once in numpy (tens of MB/s), then
    combined: a CRC register is linear over GF(2), crc(A + B) = zeros(|B|) applied to crc(A) xor crc(B)."""
    buf = data.reshape(-1).view(np.uint8) if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
    n = buf.size
    lanes = 1 << min(14, max(0, (n // 256).bit_length() - 1))
    if lanes < 64:
        raw = _raw_serial(buf)
    else:
        m = n // lanes // 8 * 8                               # bytes per lane, whole 8-byte words
        words = np.ascontiguousarray(buf[: lanes * m].reshape(lanes, m).view("<u8").T)   # (m/8, lanes)
        cols = words.view(np.uint8).reshape(m // 8, lanes, 8)                            # byte k of word j
        r, tmp, idx = np.zeros(lanes, np.uint32), np.empty(lanes, np.uint32), np.empty(lanes, np.intp)
        for j in range(m // 8):
            for k in range(8):                                # r = T[(r ^ byte) & 0xff] ^ (r >> 8), lane-wise
                np.bitwise_and(r, 0xFF, out=tmp)
                np.bitwise_xor(tmp, cols[j, :, k], out=tmp)
                idx[:] = tmp
                np.take(_TABLE, idx, out=tmp)
                np.right_shift(r, 8, out=r)
                np.bitwise_xor(r, tmp, out=r)
        width = m
        while r.size > 1:                                     # pairwise: left lane shifted past the right
            r = _apply(_zeros_matrix(width), r[0::2]) ^ r[1::2]
            width *= 2
        raw = _raw_serial(buf[lanes * m:], int(r[0]))
    start = int(_apply(_zeros_matrix(n), np.array([0xFFFFFFFF], dtype=np.uint32))[0])
    return start ^ raw ^ 0xFFFFFFFF


def unmask(masked: int) -> int:
    rot = (masked - 0xA282EAD8) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


# ---- protobuf and LevelDB blocks ------------------------------------------------------------------
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("a varint runs past its record")
        b = buf[pos]
        value |= (b & 0x7F) << shift
        pos += 1
        if not b & 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """The (field number, value) pairs of a protobuf message (varints as ints, the rest as bytes)."""
    out, pos = [], 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire in (1, 2, 5):                       # 8 bytes, length-delimited, 4 bytes
            size, pos = _varint(buf, pos) if wire == 2 else (8 if wire == 1 else 4, pos)
            value, pos = buf[pos:pos + size], pos + size
        else:
            raise ValueError(f"protobuf wire type {wire}")
        if pos > len(buf):
            raise ValueError("a field runs past its record")
        out.append((number, value))
    return out


def _block_entries(block: bytes) -> list[tuple[bytes, bytes]]:
    """Key/value pairs of one (uncompressed) table block, keys restored from their shared prefixes."""
    if len(block) < 4:
        raise ValueError("a block too short for its restart count")
    restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    end = len(block) - 4 * (restarts + 1)
    if end < 0:
        raise ValueError("a block's restart array is larger than the block")
    out, key, pos = [], b"", 0
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        size, pos = _varint(block, pos)
        if shared > len(key) or pos + unshared + size > end:
            raise ValueError("a block entry runs past the block")
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        out.append((key, block[pos:pos + size]))
        pos += size
    return out


@dataclass(frozen=True)
class Entry:
    """Where one tensor lies: dtype (numpy name), shape, and its bytes in data shard `shard`."""
    name: str
    dtype: str
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc: int | None              # masked CRC-32C of the bytes, when the index holds one


def _entry(name: str, value: bytes) -> Entry:
    shape, crc, plain = (), None, {}
    for number, v in _fields(value):
        if number == 2:
            dims = [d for n, d in _fields(v) if n == 2]
            shape = tuple(next((s for n, s in _fields(d) if n == 1), 0) for d in dims)
            if any(isinstance(s, bytes) or s >= 1 << 62 for s in shape):
                raise ValueError(f"tensor {name!r} has an unknown or negative dimension")
        elif number == 6 and isinstance(v, bytes):
            crc = struct.unpack("<I", v)[0]
        elif number == 7:
            raise ValueError(f"tensor {name!r} is partitioned into slices (not supported)")
        else:
            plain[number] = v
    dtype, shard, offset, size = (plain.get(n, 0) for n in (1, 3, 4, 5))     # BundleEntryProto's field numbers
    kind = _DTYPES.get(dtype) or _DTYPE_NAMES.get(dtype, f"dtype {dtype}")      # others are listed, not read
    return Entry(name, kind, shape, shard, offset, size, crc)


# ---- the checkpoint -------------------------------------------------------------------------------
class Checkpoint:
    """A TensorFlow checkpoint's tensors by name: `names()`, `entry(name)`, `read(name)`.

    The index is read (and checked) when the object is made; tensors are read one at a time."""

    def __init__(self, prefix: str | Path):
        self.prefix = Path(prefix)
        self.index = Path(f"{self.prefix}.index")
        if not self.index.is_file():
            raise CheckpointFormatError(f"{self.index}: no such file (not a TensorFlow checkpoint prefix)")
        try:
            header, self.entries = _read_index(self.index.read_bytes())
        except (ValueError, struct.error, IndexError) as e:
            raise CheckpointFormatError(f"{self.index}: truncated or corrupt TensorFlow checkpoint index ({e})") from None
        self.num_shards = header.get(1, 1)
        self.big_endian = header.get(2, 0) == 1
        if not isinstance(self.num_shards, int) or not 1 <= self.num_shards < 1 << 20:
            raise CheckpointFormatError(f"{self.index}: the header gives {self.num_shards} data shards")
        bad = [e.name for e in self.entries.values() if e.shard >= self.num_shards]
        if bad:
            raise CheckpointFormatError(f"{self.index}: tensor {bad[0]!r} names data shard {self.entries[bad[0]].shard}"
                                        f" of {self.num_shards}")

    def shard_path(self, shard: int) -> Path:
        return Path(f"{self.prefix}.data-{shard:05d}-of-{self.num_shards:05d}")

    def check_shards(self) -> None:
        """Every data file is there and long enough for the tensors the index places in it."""
        for shard in sorted({e.shard for e in self.entries.values()}):
            f = self.shard_path(shard)
            if not f.is_file():
                raise CheckpointFormatError(f"{f}: missing data file (the index {self.index.name} names "
                                            f"{self.num_shards} shard(s))")
            size = f.stat().st_size
            short = [e for e in self.entries.values() if e.shard == shard and e.offset + e.size > size]
            if short:
                raise CheckpointFormatError(f"{f}: truncated ({size} bytes; tensor {short[0].name!r} ends at byte "
                                            f"{short[0].offset + short[0].size})")

    def names(self) -> list[str]:
        return sorted(self.entries)

    def entry(self, name: str) -> Entry:
        return self.entries[name]

    def read(self, name: str, verify: bool = True) -> np.ndarray:
        """The tensor `name` as a numpy array (bfloat16 as float32); `verify`: check its CRC-32C."""
        e = self.entries[name]
        if e.dtype not in _DTYPES.values():
            raise CheckpointFormatError(f"{self.index}: tensor {name!r} is a {e.dtype} tensor (only numeric "
                                        "tensors are read)")
        itemsize = 2 if e.dtype == "bfloat16" else np.dtype(e.dtype).itemsize
        count = int(np.prod(e.shape, dtype=np.int64))
        f = self.shard_path(e.shard)
        if count * itemsize != e.size:
            raise CheckpointFormatError(f"{self.index}: tensor {name!r} of shape {list(e.shape)} {e.dtype} is "
                                        f"{count * itemsize} bytes but its entry says {e.size}")
        buf = bytearray(e.size)
        try:
            with open(f, "rb") as fh:
                fh.seek(e.offset)
                got = fh.readinto(buf)
        except FileNotFoundError:
            raise CheckpointFormatError(f"{f}: missing data file (the index {self.index.name} names "
                                        f"{self.num_shards} shard(s))") from None
        if got != e.size:
            raise CheckpointFormatError(f"{f}: truncated (tensor {name!r} needs bytes {e.offset}..{e.offset + e.size})")
        if verify and e.crc is not None and crc32c(buf) != unmask(e.crc):
            raise CheckpointFormatError(f"{f}: tensor {name!r} fails its checksum (the data file is corrupt)")
        order = ">" if self.big_endian else "<"
        if e.dtype == "bfloat16":      # the upper half of a float32
            half = np.frombuffer(buf, dtype=order + "u2").astype(np.uint32) << np.uint32(16)
            return half.view(np.float32).reshape(e.shape)
        arr = np.frombuffer(buf, dtype=np.dtype(e.dtype).newbyteorder(order))
        return arr.astype(np.dtype(e.dtype).newbyteorder("="), copy=False).reshape(e.shape)


def _read_block(raw: bytes, handle: bytes, what: str) -> bytes:
    offset, pos = _varint(handle, 0)
    size, _ = _varint(handle, pos)
    if offset + size + _TRAILER > len(raw) - _FOOTER:
        raise ValueError(f"the {what} block at bytes {offset}..{offset + size} lies past the end of the file")
    block, kind = raw[offset:offset + size], raw[offset + size]
    stored = struct.unpack_from("<I", raw, offset + size + 1)[0]
    if _raw_serial(raw[offset:offset + size + 1], 0xFFFFFFFF) ^ 0xFFFFFFFF != unmask(stored):
        raise ValueError(f"the {what} block at byte {offset} fails its checksum")
    if kind != 0:
        raise ValueError(f"the {what} block is {'snappy-compressed' if kind == 1 else f'of type {kind}'}, "
                         "which TensorFlow does not write")
    return block


def _read_index(raw: bytes) -> tuple[dict[int, int], dict[str, Entry]]:
    if len(raw) < _FOOTER:
        raise ValueError(f"{len(raw)} bytes, shorter than the {_FOOTER}-byte footer")
    footer = raw[-_FOOTER:]
    if struct.unpack("<Q", footer[-8:])[0] != _MAGIC:
        raise ValueError("no table magic number at its end")
    _, pos = _varint(footer, 0)
    _, pos = _varint(footer, pos)                     # past the metaindex handle: nothing in it is needed
    index = _block_entries(_read_block(raw, footer[pos:], "index"))
    header: dict[int, int] = {}
    entries: dict[str, Entry] = {}
    for _, handle in index:
        for key, value in _block_entries(_read_block(raw, handle, "data")):
            if key == b"":
                header = {n: v for n, v in _fields(value) if isinstance(v, int)}
                continue
            name = key.decode("utf-8", errors="replace")
            entries[name] = _entry(name, value)
    if not header and not entries:
        raise ValueError("the table holds no entries")
    return header, entries
