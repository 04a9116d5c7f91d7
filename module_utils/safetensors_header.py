"""Read and validate safetensors headers without torch or the safetensors package (stdlib only).

A safetensors file is: an unsigned 64-bit little-endian header length N, N bytes of UTF-8 JSON (an object,
possibly padded with trailing spaces), then the data area. Every key of the JSON object except the optional
``__metadata__`` (a string-to-string map) names a tensor: ``{"dtype": "BF16", "shape": [4, 8],
"data_offsets": [begin, end]}``, the offsets counted from the first byte after the header, end exclusive.

The checks mirror what the safetensors library itself refuses when vLLM loads the file, so a file that passes
here does not fail there for a structural reason:

- N at most 100,000,000 bytes and at most the file size minus 8;
- the header is a JSON object without duplicate keys; ``__metadata__``, when present, maps strings to strings;
- every tensor has a known dtype, a shape of non-negative integers and two integer offsets begin <= end;
- end - begin equals the element count times the dtype size;
- sorted by offset, the tensors tile the data area exactly: no overlap, no gap, nothing missing at the end
  (a truncated file) and nothing after the last tensor.

``read_header`` raises one of the ``SafetensorsError`` subclasses below, whose message is one line;
``read_checkpoint`` reads a whole directory (one file, several files, or shards listed by
``model.safetensors.index.json``) and collects the errors of every file instead of stopping at the first.
Only the header of each file is read, never the tensor data.
"""

from __future__ import annotations

import json
import os
import struct

MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit (HeaderTooLarge)
INDEX_NAME = "model.safetensors.index.json"
METADATA_KEY = "__metadata__"

# Size of one element in bits. The sub-byte float formats (F4, F6_*) are packed; a tensor of them must still
# fill a whole number of bytes.
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E4M3": 8,
    "F8_E5M2": 8,
    "F8_E8M0": 8,
    "E8M0": 8,
    "U16": 16,
    "I16": 16,
    "F16": 16,
    "BF16": 16,
    "U32": 32,
    "I32": 32,
    "F32": 32,
    "U64": 64,
    "I64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}


class SafetensorsError(ValueError):
    """A safetensors file that vLLM could not load. ``str()`` is one line: "<path>: <reason>"."""

    def __init__(self, path, reason):
        self.path = str(path)
        self.reason = " ".join(str(reason).split())
        super().__init__(f"{self.path}: {self.reason}")


class HeaderError(SafetensorsError):
    """The header length is impossible, or the header is not a JSON object of the expected form."""


class TensorInfoError(SafetensorsError):
    """One tensor's dtype, shape or byte size is wrong."""


class LayoutError(SafetensorsError):
    """Tensor data overlaps, leaves gaps, or lies outside the data area."""


class TruncatedError(LayoutError):
    """The file ends before the data its header describes."""


class ShardIndexError(SafetensorsError):
    """model.safetensors.index.json is unreadable, or disagrees with the shards it lists."""


def tensor_nbytes(dtype, shape):
    """Bytes of a tensor of `dtype` and `shape`; None when the bits do not fill a whole number of bytes."""
    count = 1
    for dim in shape:
        count *= dim
    bits = count * DTYPE_BITS[dtype]
    return bits // 8 if bits % 8 == 0 else None


def _reject_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r}")
        seen[key] = value
    return seen


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(name, limit=80):
    return repr(name if len(name) <= limit else name[:limit] + "...")


def _tensor_info(path, name, info):
    if not isinstance(info, dict):
        raise TensorInfoError(path, f"tensor {_shown(name)} is {type(info).__name__}, not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise TensorInfoError(path, f"tensor {_shown(name)} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_int(dim) and dim >= 0 for dim in shape):
        raise TensorInfoError(path, f"tensor {_shown(name)} has invalid shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) and o >= 0 for o in offsets)):
        raise TensorInfoError(path, f"tensor {_shown(name)} has invalid data_offsets {offsets!r}")
    begin, end = offsets
    if begin > end:
        raise LayoutError(path, f"tensor {_shown(name)} has data_offsets [{begin}, {end}]: begin after end")
    nbytes = tensor_nbytes(dtype, shape)
    if nbytes is None:
        raise TensorInfoError(
            path, f"tensor {_shown(name)} ({dtype} {shape}) does not fill a whole number of bytes"
        )
    if end - begin != nbytes:
        raise TensorInfoError(
            path,
            f"tensor {_shown(name)} is {dtype} {shape} = {nbytes} bytes"
            f" but data_offsets [{begin}, {end}] span {end - begin}",
        )
    return {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, end], "nbytes": nbytes}


def _check_layout(path, tensors, data_size):
    """Sorted by offset, the tensors must tile [0, data_size) exactly, as the safetensors library demands."""
    spans = sorted((info["data_offsets"][0], info["data_offsets"][1], name) for name, info in tensors.items())
    previous_end, previous_name = 0, None
    gap = None
    for begin, end, name in spans:
        if begin < previous_end:
            raise LayoutError(
                path,
                f"tensor {_shown(name)} data_offsets [{begin}, {end}] overlap tensor {_shown(previous_name)}"
                f" (which ends at {previous_end})",
            )
        if begin > previous_end and gap is None:
            gap = (previous_end, begin)
        previous_end, previous_name = end, name
    needed = previous_end
    if needed > data_size:
        if gap is None:
            raise TruncatedError(
                path,
                f"file truncated: the header describes {needed} bytes of tensor data,"
                f" the file holds {data_size} ({needed - data_size} missing)",
            )
        beyond = [(end, name) for begin, end, name in spans if end > data_size]
        end, name = max(beyond)
        raise LayoutError(
            path,
            f"tensor {_shown(name)} data_offsets end at {end}, outside the {data_size}-byte data area",
        )
    if gap is not None:
        raise LayoutError(path, f"bytes {gap[0]}..{gap[1]} of the data area belong to no tensor")
    if data_size > needed:
        raise LayoutError(
            path, f"{data_size - needed} bytes after the last tensor (the header describes {needed} bytes)"
        )


def parse_header(path, header_length, header_bytes, file_size):
    """Validate a header already read from a file of `file_size` bytes; returns the header summary.

    The summary: {"tensors": {name: {dtype, shape, data_offsets, nbytes}}, "metadata": dict or None,
    "header_length": N, "data_size": bytes after the header, "file_size": ...}. Raises SafetensorsError.
    """
    if header_length > MAX_HEADER_BYTES:
        raise HeaderError(path, f"header length {header_length} exceeds the {MAX_HEADER_BYTES}-byte limit")
    if header_length > file_size - 8:
        raise HeaderError(
            path, f"header length {header_length} exceeds the {file_size - 8} bytes after the length field"
        )
    if len(header_bytes) != header_length:
        raise TruncatedError(path, f"header truncated: {len(header_bytes)} of {header_length} bytes")
    try:
        text = header_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderError(path, f"header is not UTF-8: {exc.reason} at byte {exc.start}") from None
    try:
        header = json.loads(text, object_pairs_hook=_reject_duplicates)
    except ValueError as exc:
        raise HeaderError(path, f"header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise HeaderError(path, f"header is a JSON {type(header).__name__}, not an object")
    metadata = header.pop(METADATA_KEY, None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(value, str) for value in metadata.values())
    ):
        raise HeaderError(path, f"{METADATA_KEY} must map strings to strings, got {metadata!r:.80}")
    tensors = {name: _tensor_info(path, name, info) for name, info in header.items()}
    data_size = file_size - 8 - header_length
    _check_layout(path, tensors, data_size)
    return {
        "tensors": tensors,
        "metadata": metadata,
        "header_length": header_length,
        "data_size": data_size,
        "file_size": file_size,
    }


def read_header(path):
    """Read and validate the header of one safetensors file (not its data). Raises SafetensorsError."""
    try:
        with open(path, "rb") as handle:
            file_size = os.fstat(handle.fileno()).st_size
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise TruncatedError(
                    path, f"file is {file_size} bytes, too short for the 8-byte header length"
                )
            (header_length,) = struct.unpack("<Q", prefix)
            header_bytes = b""
            if header_length <= min(MAX_HEADER_BYTES, file_size - 8):
                header_bytes = handle.read(header_length)
    except OSError as exc:
        raise SafetensorsError(path, f"cannot read: {exc.strerror or exc}") from None
    return parse_header(path, header_length, header_bytes, file_size)


def read_index(path):
    """Read model.safetensors.index.json; returns its weight_map (tensor name -> shard file name)."""
    try:
        with open(path, "rb") as handle:
            index = json.loads(handle.read().decode("utf-8"))
    except OSError as exc:
        raise ShardIndexError(path, f"cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ShardIndexError(path, f"not valid JSON: {exc}") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ShardIndexError(path, "has no weight_map object naming the shards")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or "/" in shard or shard in (".", ".."):
            raise ShardIndexError(path, f"weight_map entry {_shown(name)} names no shard file: {shard!r}")
    return weight_map


def read_checkpoint(directory):
    """Read the headers of every safetensors file of a checkpoint directory.

    With model.safetensors.index.json the files are the shards its weight_map names (as vLLM loads them);
    without it, every *.safetensors file in the directory. Returns
    {"index": index file name or None, "files": [{"name", "size", "header"}], "tensors": {name: {dtype, shape,
    nbytes, file}}, "errors": [SafetensorsError, ...]}; a file whose header is broken appears in "files" with
    header None and contributes no tensors.
    """
    result = {"index": None, "files": [], "tensors": {}, "errors": []}
    index_path = os.path.join(directory, INDEX_NAME)
    weight_map = None
    if os.path.exists(index_path):
        result["index"] = INDEX_NAME
        try:
            weight_map = read_index(index_path)
        except ShardIndexError as exc:
            result["errors"].append(exc)
            return result
        names = sorted(set(weight_map.values()))
    else:
        names = sorted(
            entry
            for entry in os.listdir(directory)
            if entry.endswith(".safetensors") and os.path.isfile(os.path.join(directory, entry))
        )

    for name in names:
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            result["errors"].append(
                ShardIndexError(index_path, f"lists shard {name!r}, which does not exist")
            )
            continue
        entry = {"name": name, "size": os.path.getsize(path), "header": None}
        result["files"].append(entry)
        try:
            entry["header"] = read_header(path)
        except SafetensorsError as exc:
            result["errors"].append(exc)
            continue
        for tensor, info in entry["header"]["tensors"].items():
            if tensor in result["tensors"]:
                result["errors"].append(
                    LayoutError(
                        path, f"tensor {_shown(tensor)} is also in {result['tensors'][tensor]['file']}"
                    )
                )
                continue
            result["tensors"][tensor] = {
                "dtype": info["dtype"],
                "shape": info["shape"],
                "nbytes": info["nbytes"],
                "file": name,
            }

    if weight_map is not None:
        readable = {entry["name"] for entry in result["files"] if entry["header"] is not None}
        for tensor, shard in sorted(weight_map.items()):
            if shard in readable and result["tensors"].get(tensor, {}).get("file") != shard:
                result["errors"].append(
                    ShardIndexError(index_path, f"maps tensor {_shown(tensor)} to {shard}, which lacks it")
                )
    return result
