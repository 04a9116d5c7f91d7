"""Unit tests for module_utils/safetensors_header.py: well-formed files pass, each kind of damage is named."""

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ansible.module_utils import safetensors_header as sh

REPO = Path(__file__).resolve().parents[2]

# numpy dtype -> safetensors dtype, for the writer below.
NUMPY_DTYPES = {
    np.dtype("float64"): "F64",
    np.dtype("float32"): "F32",
    np.dtype("float16"): "F16",
    np.dtype("int64"): "I64",
    np.dtype("int32"): "I32",
    np.dtype("int16"): "I16",
    np.dtype("int8"): "I8",
    np.dtype("uint8"): "U8",
    np.dtype("bool"): "BOOL",
}


def raw_file(header, data=b"", header_length=None):
    """Bytes of a safetensors file with exactly this header (dict, str or bytes) and data area."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode()
    length = len(header) if header_length is None else header_length
    return struct.pack("<Q", length) + header + data


def safetensors_bytes(tensors, metadata=None, dtypes=None, pad=True):
    """A valid file for {name: numpy array}; `dtypes` overrides a stored dtype name (e.g. BF16 for uint16)."""
    dtypes = dtypes or {}
    header = {} if metadata is None else {"__metadata__": metadata}
    data, offset = b"", 0
    for name, array in tensors.items():
        blob = np.ascontiguousarray(array).tobytes()
        header[name] = {
            "dtype": dtypes[name] if name in dtypes else NUMPY_DTYPES[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        data += blob
        offset += len(blob)
    text = json.dumps(header).encode()
    if pad:
        text += b" " * (-len(text) % 8)  # as the safetensors library pads
    return raw_file(text, data)


def sample_tensors():
    return {
        "embed.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
        "half": np.ones((2, 3), dtype=np.float16),
        "ids": np.arange(5, dtype=np.int64),
        "mask": np.array([True, False, True]),
        "bytes": np.arange(7, dtype=np.uint8),
    }


def write(tmp_path, name, blob):
    path = tmp_path / name
    path.write_bytes(blob)
    return path


def header_of(blob):
    (length,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8 : 8 + length]), blob[8 + length :]


# --- well-formed files --------------------------------------------------------------------------------------


def test_reads_a_valid_file(tmp_path):
    path = write(tmp_path, "ok.safetensors", safetensors_bytes(sample_tensors(), metadata={"format": "pt"}))
    header = sh.read_header(path)
    assert header["metadata"] == {"format": "pt"}
    assert set(header["tensors"]) == set(sample_tensors())
    assert header["tensors"]["embed.weight"] == {
        "dtype": "F32",
        "shape": [3, 4],
        "data_offsets": [0, 48],
        "nbytes": 48,
    }
    assert header["tensors"]["mask"]["nbytes"] == 3
    assert header["data_size"] == sum(info["nbytes"] for info in header["tensors"].values())
    assert header["file_size"] == path.stat().st_size == 8 + header["header_length"] + header["data_size"]


def test_bf16_and_unpadded_header(tmp_path):
    tensors = {"w": np.zeros((4, 2), dtype=np.uint16)}
    blob = safetensors_bytes(tensors, dtypes={"w": "BF16"}, pad=False)
    header = sh.read_header(write(tmp_path, "bf16.safetensors", blob))
    assert header["tensors"]["w"]["dtype"] == "BF16"
    assert header["tensors"]["w"]["nbytes"] == 16
    assert header["metadata"] is None


def test_empty_header_and_zero_sized_tensors(tmp_path):
    assert sh.read_header(write(tmp_path, "empty.safetensors", raw_file({})))["tensors"] == {}
    tensors = {"none": np.zeros((0, 8), dtype=np.float32), "scalar": np.float32(3.0).reshape(())}
    header = sh.read_header(write(tmp_path, "zero.safetensors", safetensors_bytes(tensors)))
    assert header["tensors"]["none"]["data_offsets"] == [0, 0]
    assert header["tensors"]["scalar"]["shape"] == []
    assert header["tensors"]["scalar"]["nbytes"] == 4


@pytest.mark.parametrize(
    "dtype, size",
    [
        ("F64", 8),
        ("F32", 4),
        ("F16", 2),
        ("BF16", 2),
        ("I64", 8),
        ("I32", 4),
        ("I16", 2),
        ("I8", 1),
        ("U8", 1),
        ("BOOL", 1),
        ("F8_E4M3", 1),
        ("F8_E5M2", 1),
        ("U16", 2),
        ("U32", 4),
        ("U64", 8),
    ],
)
def test_every_dtype_size(tmp_path, dtype, size):
    assert sh.tensor_nbytes(dtype, [3, 5]) == 15 * size
    header = {"t": {"dtype": dtype, "shape": [3, 5], "data_offsets": [0, 15 * size]}}
    parsed = sh.read_header(write(tmp_path, "t.safetensors", raw_file(header, b"\0" * (15 * size))))
    assert parsed["tensors"]["t"]["nbytes"] == 15 * size


def test_sub_byte_dtypes():
    assert sh.tensor_nbytes("F4", [2, 8]) == 8
    assert sh.tensor_nbytes("F4", [3]) is None
    assert sh.tensor_nbytes("F6_E2M3", [4]) == 3


@pytest.mark.parametrize("name", ["tiny-llama", "eagle3-accept", "eagle3-random"])
def test_the_repos_sim_models_validate(sim_models, name):
    path = sim_models / name / "model.safetensors"
    header = sh.read_header(path)
    raw_header, _data = header_of(path.read_bytes())
    assert header["metadata"] == {"format": "pt"}
    assert set(header["tensors"]) == set(raw_header) - {"__metadata__"}
    assert header["data_size"] == sum(info["nbytes"] for info in header["tensors"].values())
    if name != "tiny-llama":
        assert header["tensors"]["d2t"]["dtype"] == "I64"
        assert header["tensors"]["t2d"]["dtype"] == "BOOL"


@pytest.fixture(scope="module")
def sim_models(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim-models")
    subprocess.run(
        [sys.executable, str(REPO / "sim" / "build_models.py"), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    return out


# --- damage -------------------------------------------------------------------------------------------------


def one_tensor_header(**info):
    entry = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
    entry.update(info)
    return {"t": entry}


@pytest.mark.parametrize(
    "blob, error, reason",
    [
        (b"", sh.TruncatedError, "too short for the 8-byte header length"),
        (b"\x01\x00\x00", sh.TruncatedError, "too short"),
        (raw_file(b"{}", header_length=2**60), sh.HeaderError, "exceeds the 100000000-byte limit"),
        (raw_file(b"{}", header_length=200_000_000), sh.HeaderError, "exceeds the 100000000-byte limit"),
        (raw_file(b"{}", header_length=50), sh.HeaderError, "header length 50 exceeds the 2 bytes after"),
        (raw_file(b"\xff\xfe{}"), sh.HeaderError, "not UTF-8"),
        (raw_file(b"PK\x03\x04 this is a zip"), sh.HeaderError, "not valid JSON"),
        (raw_file(b'{"t": {"dtype": "F32"'), sh.HeaderError, "not valid JSON"),
        (raw_file(b"[1, 2, 3]"), sh.HeaderError, "JSON list, not an object"),
        (raw_file(b'{"a": {}, "a": {}}'), sh.HeaderError, "duplicate key 'a'"),
        (raw_file({"__metadata__": {"format": 1}}), sh.HeaderError, "must map strings to strings"),
        (raw_file({"__metadata__": ["pt"]}), sh.HeaderError, "must map strings to strings"),
        (raw_file({"t": [0, 16]}), sh.TensorInfoError, "tensor 't' is list, not an object"),
        (raw_file(one_tensor_header(dtype="F12"), b"\0" * 16), sh.TensorInfoError, "unknown dtype 'F12'"),
        (raw_file(one_tensor_header(dtype=None), b"\0" * 16), sh.TensorInfoError, "unknown dtype None"),
        (raw_file(one_tensor_header(shape=[2, -2]), b"\0" * 16), sh.TensorInfoError, "invalid shape"),
        (raw_file(one_tensor_header(shape=[2, 2.0]), b"\0" * 16), sh.TensorInfoError, "invalid shape"),
        (raw_file(one_tensor_header(shape=[True, 4]), b"\0" * 16), sh.TensorInfoError, "invalid shape"),
        (raw_file(one_tensor_header(shape="2x2"), b"\0" * 16), sh.TensorInfoError, "invalid shape"),
        (
            raw_file(one_tensor_header(data_offsets=[0]), b"\0" * 16),
            sh.TensorInfoError,
            "invalid data_offsets",
        ),
        (raw_file(one_tensor_header(data_offsets=[-16, 0]), b"\0" * 16), sh.TensorInfoError, "invalid data"),
        (raw_file(one_tensor_header(data_offsets=[16, 0]), b"\0" * 16), sh.LayoutError, "begin after end"),
        (raw_file(one_tensor_header(shape=[2, 3]), b"\0" * 16), sh.TensorInfoError, "= 24 bytes but data_"),
        (raw_file(one_tensor_header(dtype="F4", shape=[3]), b"\0" * 16), sh.TensorInfoError, "whole number"),
    ],
)
def test_broken_headers(tmp_path, blob, error, reason):
    path = write(tmp_path, "broken.safetensors", blob)
    with pytest.raises(error, match=reason) as caught:
        sh.read_header(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert "\n" not in message
    assert isinstance(caught.value, sh.SafetensorsError) and isinstance(caught.value, ValueError)


def test_truncated_file(tmp_path):
    blob = safetensors_bytes(sample_tensors())
    path = write(tmp_path, "cut.safetensors", blob[:-10])
    with pytest.raises(sh.TruncatedError, match=r"file truncated: .* \(10 missing\)"):
        sh.read_header(path)
    # Cut inside the header: the length field promises more than the file holds.
    path = write(tmp_path, "cut-header.safetensors", blob[:20])
    with pytest.raises(sh.HeaderError, match="exceeds the 12 bytes after the length field"):
        sh.read_header(path)


def test_overlapping_offsets(tmp_path):
    header, data = header_of(safetensors_bytes(sample_tensors()))
    header["half"]["data_offsets"] = [40, 52]  # inside embed.weight [0, 48)
    with pytest.raises(sh.LayoutError, match=r"tensor 'half' data_offsets \[40, 52\] overlap tensor 'embed"):
        sh.read_header(write(tmp_path, "overlap.safetensors", raw_file(header, data)))


def test_identical_offsets_overlap(tmp_path):
    tensors = {"a": np.zeros(4, dtype=np.float32), "b": np.zeros(4, dtype=np.float32)}
    header, data = header_of(safetensors_bytes(tensors))
    header["b"]["data_offsets"] = header["a"]["data_offsets"]
    with pytest.raises(sh.LayoutError, match="overlap"):
        sh.read_header(write(tmp_path, "same.safetensors", raw_file(header, data[:16])))


def test_out_of_range_offsets(tmp_path):
    header, data = header_of(safetensors_bytes(sample_tensors()))
    begin, end = header["ids"]["data_offsets"]
    header["ids"]["data_offsets"] = [begin + 4096, end + 4096]
    with pytest.raises(
        sh.LayoutError, match=r"tensor 'ids' data_offsets end at \d+, outside the \d+-byte data"
    ):
        sh.read_header(write(tmp_path, "range.safetensors", raw_file(header, data)))


def test_gap_between_tensors(tmp_path):
    tensors = {"a": np.zeros(4, dtype=np.float32), "b": np.zeros(4, dtype=np.float32)}
    header, data = header_of(safetensors_bytes(tensors))
    header["b"]["data_offsets"] = [24, 40]
    with pytest.raises(sh.LayoutError, match=r"bytes 16\.\.24 of the data area belong to no tensor"):
        sh.read_header(write(tmp_path, "gap.safetensors", raw_file(header, data + b"\0" * 8)))


def test_bytes_after_the_last_tensor(tmp_path):
    blob = safetensors_bytes(sample_tensors()) + b"junk"
    with pytest.raises(sh.LayoutError, match="4 bytes after the last tensor"):
        sh.read_header(write(tmp_path, "trailing.safetensors", blob))


def test_unreadable_path(tmp_path):
    with pytest.raises(sh.SafetensorsError, match="cannot read"):
        sh.read_header(tmp_path / "absent.safetensors")
    with pytest.raises(sh.SafetensorsError, match="cannot read"):
        sh.read_header(tmp_path)


def test_long_names_are_shortened_in_messages(tmp_path):
    name = "x" * 500
    header = {name: {"dtype": "NOPE", "shape": [1], "data_offsets": [0, 1]}}
    with pytest.raises(sh.TensorInfoError) as caught:
        sh.read_header(write(tmp_path, "long.safetensors", raw_file(header, b"\0")))
    assert len(str(caught.value)) < 300


# --- whole checkpoints --------------------------------------------------------------------------------------


def split_checkpoint(directory, tensors, shards=2, index=True):
    """Write `tensors` over `shards` files (HF naming) and, with `index`, model.safetensors.index.json."""
    names = sorted(tensors)
    weight_map = {}
    for number in range(shards):
        file_name = f"model-{number + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: tensors[name] for name in names[number::shards]}
        (directory / file_name).write_bytes(safetensors_bytes(part))
        weight_map.update(dict.fromkeys(part, file_name))
    if index:
        (directory / sh.INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return weight_map


def test_checkpoint_single_file(tmp_path):
    write(tmp_path, "model.safetensors", safetensors_bytes(sample_tensors()))
    (tmp_path / "config.json").write_text("{}")
    checkpoint = sh.read_checkpoint(tmp_path)
    assert checkpoint["index"] is None
    assert checkpoint["errors"] == []
    assert [entry["name"] for entry in checkpoint["files"]] == ["model.safetensors"]
    assert checkpoint["tensors"]["ids"] == {
        "dtype": "I64",
        "shape": [5],
        "nbytes": 40,
        "file": "model.safetensors",
    }


def test_checkpoint_sharded_with_index(tmp_path):
    weight_map = split_checkpoint(tmp_path, sample_tensors(), shards=2)
    write(tmp_path, "stray.safetensors", b"not read: the index does not list it")
    checkpoint = sh.read_checkpoint(tmp_path)
    assert checkpoint["errors"] == []
    assert checkpoint["index"] == sh.INDEX_NAME
    assert [entry["name"] for entry in checkpoint["files"]] == sorted(set(weight_map.values()))
    assert {name: info["file"] for name, info in checkpoint["tensors"].items()} == weight_map


def test_checkpoint_without_index_reads_every_file(tmp_path):
    split_checkpoint(tmp_path, sample_tensors(), shards=3, index=False)
    checkpoint = sh.read_checkpoint(tmp_path)
    assert checkpoint["errors"] == []
    assert len(checkpoint["files"]) == 3
    assert set(checkpoint["tensors"]) == set(sample_tensors())


def test_checkpoint_missing_shard(tmp_path):
    weight_map = split_checkpoint(tmp_path, sample_tensors(), shards=2)
    missing = sorted(set(weight_map.values()))[1]
    (tmp_path / missing).unlink()
    checkpoint = sh.read_checkpoint(tmp_path)
    assert [str(error) for error in checkpoint["errors"]] == [
        f"{tmp_path / sh.INDEX_NAME}: lists shard {missing!r}, which does not exist"
    ]
    assert len(checkpoint["tensors"]) == len([shard for shard in weight_map.values() if shard != missing])


def test_checkpoint_index_points_at_the_wrong_shard(tmp_path):
    weight_map = split_checkpoint(tmp_path, sample_tensors(), shards=2)
    shards = sorted(set(weight_map.values()))
    weight_map["ids"] = shards[0] if weight_map["ids"] == shards[1] else shards[1]
    (tmp_path / sh.INDEX_NAME).write_text(json.dumps({"weight_map": weight_map}))
    errors = [str(error) for error in sh.read_checkpoint(tmp_path)["errors"]]
    assert errors == [f"{tmp_path / sh.INDEX_NAME}: maps tensor 'ids' to {weight_map['ids']}, which lacks it"]


def test_checkpoint_broken_shard_keeps_the_others(tmp_path):
    weight_map = split_checkpoint(tmp_path, sample_tensors(), shards=2)
    first, second = sorted(set(weight_map.values()))
    (tmp_path / first).write_bytes((tmp_path / first).read_bytes()[:-3])
    checkpoint = sh.read_checkpoint(tmp_path)
    assert len(checkpoint["errors"]) == 1
    assert isinstance(checkpoint["errors"][0], sh.TruncatedError)
    assert {info["file"] for info in checkpoint["tensors"].values()} == {second}
    assert [entry["header"] is None for entry in checkpoint["files"]] == [True, False]


def test_checkpoint_duplicate_tensor_across_files(tmp_path):
    write(tmp_path, "a.safetensors", safetensors_bytes({"w": np.zeros(2, dtype=np.float32)}))
    write(tmp_path, "b.safetensors", safetensors_bytes({"w": np.zeros(2, dtype=np.float32)}))
    errors = [str(error) for error in sh.read_checkpoint(tmp_path)["errors"]]
    assert errors == [f"{tmp_path / 'b.safetensors'}: tensor 'w' is also in a.safetensors"]


@pytest.mark.parametrize(
    "index, reason",
    [
        ("{not json", "not valid JSON"),
        ("[]", "has no weight_map"),
        ('{"weight_map": {}}', "has no weight_map"),
        ('{"weight_map": {"w": null}}', "names no shard file"),
        ('{"weight_map": {"w": "../elsewhere.safetensors"}}', "names no shard file"),
    ],
)
def test_checkpoint_bad_index(tmp_path, index, reason):
    (tmp_path / sh.INDEX_NAME).write_text(index)
    checkpoint = sh.read_checkpoint(tmp_path)
    assert len(checkpoint["errors"]) == 1
    assert isinstance(checkpoint["errors"][0], sh.ShardIndexError)
    assert reason in str(checkpoint["errors"][0])
    assert checkpoint["files"] == []


def test_checkpoint_with_no_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert sh.read_checkpoint(tmp_path) == {"index": None, "files": [], "tensors": {}, "errors": []}
