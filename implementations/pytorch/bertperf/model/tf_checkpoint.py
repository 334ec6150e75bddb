"""Read TensorFlow V2 checkpoints (tensor bundles) without TensorFlow, and turn Google's BERT
variables (MLPerf's `model.ckpt-28252`) into BertForPreTraining's state dict.

A checkpoint `PREFIX` is `PREFIX.index` plus `PREFIX.data-SSSSS-of-NNNNN` shards (and, from TF1,
the graph in `PREFIX.meta`, not needed here); any of these names stands for the prefix
(`checkpoint_prefix`). The index is a LevelDB SSTable (footer -> index block -> data blocks of
prefix-compressed keys; every block followed by a compression byte and a masked crc32c), mapping
"" to a BundleHeaderProto and every variable name to a BundleEntryProto: dtype, shape, shard,
offset and size of its little-endian bytes in the data file, and their masked crc32c.
Open-source TF writes the index uncompressed (tensor_bundle.cc: kNoCompression since 1.2);
snappy-compressed blocks, which TF reads and other writers may produce, are decoded in pure
Python. Every tensor read is checked against its crc32c (google-crc32c's C code when installed,
else a NumPy implementation).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from bertperf.errors import UserError
from bertperf.model.bert import BertForPreTraining
from bertperf.model.bert_config import BertConfig
from bertperf.model.hf import from_hf_state_dict, tf_name, tf_transposed, to_hf_state_dict

_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_SIZE = 48
_BLOCK_TRAILER_SIZE = 5  # compression type byte + masked crc32c
DTYPES = {  # TF DataType enum (types.proto) -> (name, little-endian numpy dtype)
    1: ("DT_FLOAT", "<f4"), 2: ("DT_DOUBLE", "<f8"), 3: ("DT_INT32", "<i4"),
    4: ("DT_UINT8", "u1"), 5: ("DT_INT16", "<i2"), 6: ("DT_INT8", "i1"), 7: ("DT_STRING", None),
    9: ("DT_INT64", "<i8"), 10: ("DT_BOOL", "?"), 14: ("DT_BFLOAT16", "<u2"),
    17: ("DT_UINT16", "<u2"), 19: ("DT_HALF", "<f2"), 22: ("DT_UINT32", "<u4"),
    23: ("DT_UINT64", "<u8"),
}
_FLOAT_DTYPES = (1, 2, 14, 19)
_ENTRY_INTS = {1: "dtype", 3: "shard", 4: "offset", 5: "size", 6: "masked_crc32c"}
"""BundleEntryProto's scalar fields by number (2 = shape and 7 = slices are messages)."""


# ---- crc32c (Castagnoli), LevelDB/TF masking -----------------------------------------------------

def _crc32c_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1)
    return table.astype(np.uint32)


_TABLE = _crc32c_table()
_TABLE_LIST = _TABLE.tolist()


def _raw_crc_loop(data: np.ndarray, state: int = 0) -> int:
    """The CRC register after feeding `data` (uint8) from `state`, one byte at a time, no final
    xor."""
    table = _TABLE_LIST
    for byte in data.tobytes():
        state = table[(state ^ byte) & 0xFF] ^ (state >> 8)
    return state


@functools.lru_cache(maxsize=None)
def _zeros_power(k: int) -> tuple[np.ndarray, ...]:
    """The linear map "feed 2**k zero bytes" on the CRC register, as 4 byte-lookup tables."""
    if k == 0:
        columns = np.array([_raw_crc_loop(np.zeros(1, np.uint8), 1 << b) for b in range(32)],
                           np.uint32)
    else:
        half = _zeros_power(k - 1)
        columns = _apply(half, _apply(half, np.uint32(1) << np.arange(32, dtype=np.uint32)))
    values = np.arange(256, dtype=np.uint32)
    tables = []
    for p in range(4):
        t = np.zeros(256, np.uint32)
        for b in range(8):
            t ^= np.where((values >> b) & 1, columns[8 * p + b], np.uint32(0))
        tables.append(t)
    return tuple(tables)


def _apply(tables: tuple[np.ndarray, ...], x: np.ndarray) -> np.ndarray:
    return (tables[0][x & 0xFF] ^ tables[1][(x >> 8) & 0xFF] ^ tables[2][(x >> 16) & 0xFF]
            ^ tables[3][x >> 24])


def _feed_zeros(state: np.ndarray, n: int) -> np.ndarray:
    """The registers `state` after feeding n zero bytes to each (a product of _zeros_power maps)."""
    k = 0
    while n:
        if n & 1:
            state = _apply(_zeros_power(k), state)
        n >>= 1
        k += 1
    return state


@functools.lru_cache(maxsize=None)
def _word_tables() -> tuple[np.ndarray, np.ndarray]:
    """The map "feed 4 zero bytes" as two 16-bit lookup tables (of the low and high half)."""
    t = _zeros_power(2)
    low = np.arange(1 << 16, dtype=np.uint32)
    return t[0][low & 0xFF] ^ t[1][low >> 8], t[2][low & 0xFF] ^ t[3][low >> 8]


def _raw_crc(data: np.ndarray) -> int:
    """The CRC register after feeding `data` (uint8) from 0, no final xor. The CRC is linear:
    feeding a little-endian 32-bit word w is feed_zeros(state ^ w, 4), and up to 65536 equal
    rows are fed in parallel (one NumPy step per word column), then combined pairwise:
    crc(A + B) = feed_zeros(crc(A), len(B)) ^ crc(B)."""
    n = len(data)
    if n < 4096:
        return _raw_crc_loop(data)
    rows = 1 << min(16, (n // 64).bit_length() - 1)
    length = n // rows // 4 * 4
    head, tail = data[:rows * length], data[rows * length:]
    low, high = _word_tables()
    state = np.zeros(rows, np.uint32)
    for word in np.ascontiguousarray(head.reshape(rows, length).view("<u4").T):
        state ^= word
        state = low[state & 0xFFFF] ^ high[state >> 16]
    while len(state) > 1:
        state = _feed_zeros(state[0::2], length) ^ state[1::2]
        length *= 2
    return int(_feed_zeros(state, len(tail))[0]) ^ _raw_crc(tail)


def crc32c_numpy(data: bytes) -> int:
    """crc32c of `data` without C extensions (the fallback of `crc32c`)."""
    raw = _raw_crc(np.frombuffer(data, np.uint8))
    return int(_feed_zeros(np.array([0xFFFFFFFF], np.uint32), len(data))[0]) ^ raw ^ 0xFFFFFFFF


try:
    import google_crc32c
except ImportError:
    google_crc32c = None

if google_crc32c is not None and google_crc32c.implementation == "c":
    crc32c = google_crc32c.value
else:
    crc32c = crc32c_numpy


def masked_crc32c(data: bytes) -> int:
    """LevelDB's and TF's stored form of a crc32c: rotated right by 15 bits plus a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ---- protobuf wire format and SSTable ------------------------------------------------------------

def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of a protobuf message: ints for varint/fixed, bytes otherwise."""
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        wire = tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            value, pos = int.from_bytes(buf[pos:pos + width], "little"), pos + width
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > len(buf):
            raise ValueError("truncated protobuf field")
        yield tag >> 3, value


def snappy_decompress(data: bytes) -> bytes:
    """Decode a raw snappy stream: the uncompressed length (varint), then elements whose tag's
    low 2 bits say literal (0) or copy with a 1-, 2- or 4-byte offset back into the output."""
    size, pos = _varint(data, 0)
    out = bytearray()
    while pos < len(data):
        tag, kind = data[pos], data[pos] & 3
        pos += 1
        if kind == 0:
            length = tag >> 2
            if length >= 60:  # the length - 1 follows in 1..4 bytes
                width = length - 59
                length, pos = int.from_bytes(data[pos:pos + width], "little"), pos + width
            length += 1
            if pos + length > len(data):
                raise ValueError("snappy literal runs past the block")
            out += data[pos:pos + length]
            pos += length
            continue
        if kind == 1:
            length, offset = 4 + ((tag >> 2) & 7), ((tag >> 5) << 8) | data[pos]
            pos += 1
        else:
            width = 2 if kind == 2 else 4
            length, offset = 1 + (tag >> 2), int.from_bytes(data[pos:pos + width], "little")
            pos += width
        if not 0 < offset <= len(out):
            raise ValueError("snappy copy from before the start of the block")
        start = len(out) - offset
        chunk = out[start:start + length]  # shorter than length when the copy overlaps itself
        out += (chunk * (length // len(chunk) + 1))[:length]
    if len(out) != size:
        raise ValueError(f"snappy block decodes to {len(out)} bytes, its header says {size}")
    return bytes(out)


def _block(data: bytes, handle: bytes) -> bytes:
    """The contents of the SSTable block that BlockHandle `handle` (offset, size) points to."""
    offset, pos = _varint(handle, 0)
    size, _ = _varint(handle, pos)
    end = offset + size
    if end + _BLOCK_TRAILER_SIZE > len(data) - _FOOTER_SIZE:
        raise ValueError(f"block [{offset}, {end}) runs past the end of the file")
    kind, stored = data[end], int.from_bytes(data[end + 1:end + 5], "little")
    if masked_crc32c(data[offset:end + 1]) != stored:
        raise ValueError(f"crc32c mismatch in the block at offset {offset}")
    if kind == 1:
        return snappy_decompress(data[offset:end])
    if kind != 0:
        raise ValueError(f"unknown block compression type {kind}")
    return data[offset:end]


def _block_entries(block: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) of a block: each entry's key shares a prefix with the previous one; the
    restart array at the end (count in the last 4 bytes) is only needed for seeking."""
    restarts = int.from_bytes(block[-4:], "little")
    end = len(block) - 4 * (restarts + 1)
    if end < 0:
        raise ValueError("bad restart array")
    key, pos = b"", 0
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        size, pos = _varint(block, pos)
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        yield key, block[pos:pos + size]
        pos += size
    if pos != end:
        raise ValueError("entries overrun the restart array")


def read_sstable(path: Path) -> dict[bytes, bytes]:
    """Every key and value of the LevelDB-format table file `path` (UserError if malformed)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file (is the TF checkpoint prefix right?)") from None
    if len(data) < _FOOTER_SIZE or int.from_bytes(data[-8:], "little") != _TABLE_MAGIC:
        raise UserError(f"{path}: not a TensorFlow checkpoint index (no SSTable magic number)")
    footer = data[-_FOOTER_SIZE:]
    try:
        _, pos = _varint(footer, 0)  # the metaindex block's offset
        _, pos = _varint(footer, pos)  # and size: it is empty in TF's tables
        entries = {}
        for _, handle in _block_entries(_block(data, footer[pos:])):
            entries.update(_block_entries(_block(data, handle)))
    except (ValueError, IndexError) as e:
        raise UserError(f"{path}: corrupt TensorFlow checkpoint index: {e}") from None
    return entries


# ---- tensor bundle -------------------------------------------------------------------------------

_CHECKPOINT_FILE = re.compile(r"^(.+)\.(index|meta|data-\d+-of-\d+)$")


def checkpoint_prefix(path: str | Path) -> Path:
    """The prefix of the TF checkpoint that `path` names: `path` itself when `path`.index exists,
    else `path` without the suffix of a checkpoint's own file (.index, .meta,
    .data-SSSSS-of-NNNNN), else `path` unchanged."""
    path = Path(path)
    if Path(f"{path}.index").is_file():
        return path
    m = _CHECKPOINT_FILE.match(path.name)
    return path.with_name(m.group(1)) if m else path


@dataclass(frozen=True)
class TensorEntry:
    """Where and how one variable is stored (a BundleEntryProto)."""

    dtype: int
    """TF DataType enum value (DTYPES)."""
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    """Bytes in the data file."""
    masked_crc32c: int
    sliced: bool
    """A partitioned variable: the bytes are in per-slice entries, which this reader does not
    support."""

    @property
    def dtype_name(self) -> str:
        return DTYPES.get(self.dtype, (f"DataType {self.dtype}", None))[0]

    @classmethod
    def parse(cls, buf: bytes) -> TensorEntry:
        """From a serialized BundleEntryProto (absent fields are proto3 defaults)."""
        f: dict = {"dtype": 0, "shape": (), "shard": 0, "offset": 0, "size": 0,
                   "masked_crc32c": 0, "sliced": False}
        for number, value in _fields(buf):
            if number == 2:
                f["shape"] = _shape(value)
            elif number == 7:
                f["sliced"] = True
            elif number in _ENTRY_INTS:
                f[_ENTRY_INTS[number]] = value
        return cls(**f)


def _shape(buf: bytes) -> tuple[int, ...]:
    """A TensorShapeProto's dims (dim = 2, each Dim with size = 1)."""
    dims = []
    for number, value in _fields(buf):
        if number == 3 and value:
            raise ValueError("tensor of unknown rank")
        if number == 2:
            size = dict(_fields(value)).get(1, 0)
            dims.append(size - (1 << 64) if size >= 1 << 63 else size)
    return tuple(dims)


class TFCheckpoint:
    """A TF V2 checkpoint opened by its prefix (or one of its files): the index is read at once,
    tensors on `read`."""

    def __init__(self, prefix: str | Path):
        self.prefix = str(checkpoint_prefix(prefix))
        self.index_path = Path(self.prefix + ".index")
        table = read_sstable(self.index_path)
        try:
            header = dict(_fields(table.pop(b"")))
            self.entries = {key.decode(): TensorEntry.parse(value) for key, value in table.items()}
        except KeyError:
            raise UserError(f"{self.index_path}: no bundle header (not a V2 checkpoint)") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise UserError(f"{self.index_path}: corrupt TensorFlow checkpoint index: "
                            f"{e}") from None
        self.num_shards = header.get(1, 0)
        if header.get(2, 0) != 0:
            raise UserError(f"{self.index_path}: big-endian checkpoint, not supported")

    def names(self) -> list[str]:
        """Every variable name, sorted (TF's order)."""
        return sorted(self.entries)

    def data_path(self, entry: TensorEntry) -> Path:
        return Path(f"{self.prefix}.data-{entry.shard:05d}-of-{self.num_shards:05d}")

    def read(self, name: str) -> np.ndarray:
        """Variable `name` as a new numpy array, its crc32c checked; bfloat16 is widened to float32
        (exactly). String, sliced and unknown-dtype variables are a UserError."""
        entry = self.entries.get(name)
        if entry is None:
            raise UserError(f"{self.index_path}: no variable {name}")
        kind = DTYPES.get(entry.dtype, (None, None))[1]
        if kind is None or entry.sliced:
            what = "partitioned variables" if entry.sliced else f"dtype {entry.dtype_name}"
            raise UserError(f"{self.index_path}: variable {name}: {what} not supported")
        dtype = np.dtype(kind)
        count = int(np.prod(entry.shape, dtype=np.int64))
        if min(entry.shape, default=0) < 0 or count * dtype.itemsize != entry.size:
            raise UserError(f"{self.index_path}: variable {name}: shape {entry.shape} "
                            f"{entry.dtype_name} does not fill its {entry.size} bytes")
        path = self.data_path(entry)
        try:
            with open(path, "rb") as f:
                f.seek(entry.offset)
                raw = f.read(entry.size)
        except FileNotFoundError:
            raise UserError(f"{path}: no such file (data shard of {self.index_path})") from None
        if len(raw) != entry.size:
            raise UserError(f"{path}: truncated: variable {name} needs bytes [{entry.offset}, "
                            f"{entry.offset + entry.size}), the file has "
                            f"{path.stat().st_size}")
        if masked_crc32c(raw) != entry.masked_crc32c:
            raise UserError(f"{path}: crc32c mismatch in variable {name} (corrupt checkpoint)")
        array = np.frombuffer(raw, dtype).reshape(entry.shape)
        if entry.dtype == 14:  # bfloat16: the high half of a float32
            return (array.astype(np.uint32) << 16).view(np.float32)
        return array.astype(dtype.newbyteorder("="))


# ---- Google's BERT -> bertperf -------------------------------------------------------------------

def _dims(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) or "scalar"


def state_dict_from_tf(prefix: str | Path, config: BertConfig) -> dict[str, torch.Tensor]:
    """BertForPreTraining's state dict (float32, strict) from Google's BERT checkpoint `prefix`
    (or one of its files): kernels transposed, vocabulary rows padded with zeros
    (hf.from_hf_state_dict). Optimizer slots (adam_m, adam_v), global_step and other
    non-parameters are ignored; a missing parameter or one of another shape than `config` needs
    is a UserError."""
    ckpt = TFCheckpoint(prefix)
    with torch.device("meta"):
        ours = BertForPreTraining(config).state_dict()
    unpadded = {}
    for name, meta in to_hf_state_dict(ours, config).items():
        if name not in ours:
            continue  # HF's tied decoder
        var = tf_name(name)
        shape = tuple(meta.shape)[::-1] if tf_transposed(name) else tuple(meta.shape)
        entry = ckpt.entries.get(var)
        if entry is None:
            raise UserError(f"{ckpt.index_path}: no variable {var} (parameter {name}); not a "
                            "BERT pretraining checkpoint?")
        if entry.shape != shape:
            raise UserError(f"{ckpt.index_path}: variable {var} is {_dims(entry.shape)}, the BERT "
                            f"config needs {_dims(shape)} (checkpoint and bert_config differ)")
        if entry.dtype not in _FLOAT_DTYPES:
            raise UserError(f"{ckpt.index_path}: variable {var} is {entry.dtype_name}, "
                            "expected a float")
        array = ckpt.read(var)
        tensor = torch.from_numpy(array.T if tf_transposed(name) else array)
        unpadded[name] = tensor.to(torch.float32).contiguous()
    return from_hf_state_dict(unpadded, config)
