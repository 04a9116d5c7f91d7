"""Tests for sim/build_models.py: the files it writes must be what vLLM expects to load."""

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import script_module
from tokenizers import Tokenizer

SCRIPT = Path(__file__).resolve().parents[2] / "sim" / "build_models.py"
DTYPES = {"BF16": ("<u2", 2), "I64": ("<i8", 8), "BOOL": ("?", 1)}


builder = script_module.load(SCRIPT, "build_sim_models")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sim-models")
    builder.build(out)
    return out


def read_safetensors(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """Independent reader: returns the raw header and each tensor as a numpy array (bf16 -> float32)."""
    raw = path.read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_len])
    data = raw[8 + header_len :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        numpy_dtype, _ = DTYPES[info["dtype"]]
        start, end = info["data_offsets"]
        array = np.frombuffer(data[start:end], dtype=numpy_dtype).reshape(info["shape"])
        if info["dtype"] == "BF16":
            array = (array.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = array
    return header, tensors


def config(models: Path, name: str) -> dict:
    return json.loads((models / name / "config.json").read_text())


def tree_hashes(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


@pytest.mark.parametrize("name", ["tiny-llama", "eagle3-accept", "eagle3-random"])
def test_safetensors_header_and_offsets(models, name):
    path = models / name / "model.safetensors"
    raw = path.read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    assert header_len % 8 == 0
    header, _ = read_safetensors(path)
    spans = sorted(
        (info["data_offsets"], info["dtype"], info["shape"])
        for key, info in header.items()
        if key != "__metadata__"
    )
    position = 0
    for (start, end), dtype, shape in spans:
        assert start == position, "tensor data must be contiguous"
        assert end - start == int(np.prod(shape)) * DTYPES[dtype][1]
        assert start % DTYPES[dtype][1] == 0, "tensor data must be aligned to its element size"
        position = end
    assert 8 + header_len + position == len(raw)


def test_target_shapes_match_config(models):
    cfg = config(models, "tiny-llama")
    hidden, heads, kv_heads = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    q_size, kv_size = heads * cfg["head_dim"], kv_heads * cfg["head_dim"]
    inter = cfg["intermediate_size"]
    expected = {
        "model.embed_tokens.weight": [cfg["vocab_size"], hidden],
        "model.norm.weight": [hidden],
        "lm_head.weight": [cfg["vocab_size"], hidden],
    }
    for layer in range(cfg["num_hidden_layers"]):
        prefix = f"model.layers.{layer}"
        expected |= {
            f"{prefix}.self_attn.q_proj.weight": [q_size, hidden],
            f"{prefix}.self_attn.k_proj.weight": [kv_size, hidden],
            f"{prefix}.self_attn.v_proj.weight": [kv_size, hidden],
            f"{prefix}.self_attn.o_proj.weight": [hidden, q_size],
            f"{prefix}.mlp.gate_proj.weight": [inter, hidden],
            f"{prefix}.mlp.up_proj.weight": [inter, hidden],
            f"{prefix}.mlp.down_proj.weight": [hidden, inter],
            f"{prefix}.input_layernorm.weight": [hidden],
            f"{prefix}.post_attention_layernorm.weight": [hidden],
        }
    header, _ = read_safetensors(models / "tiny-llama" / "model.safetensors")
    assert {name: info["shape"] for name, info in header.items() if name != "__metadata__"} == expected
    assert {info["dtype"] for name, info in header.items() if name != "__metadata__"} == {"BF16"}
    assert cfg["torch_dtype"] == "bfloat16" and cfg["tie_word_embeddings"] is False


@pytest.mark.parametrize("name", ["eagle3-accept", "eagle3-random"])
def test_drafter_shapes_match_config(models, name):
    cfg = config(models, name)
    target = config(models, "tiny-llama")
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert all(layer < target["num_hidden_layers"] for layer in cfg["eagle_aux_hidden_state_layer_ids"])
    assert "norm_before_residual" in cfg
    hidden = cfg["hidden_size"]
    q_size = cfg["num_attention_heads"] * cfg["head_dim"]
    kv_size = cfg["num_key_value_heads"] * cfg["head_dim"]
    inter = cfg["intermediate_size"]
    fc_in = len(cfg["eagle_aux_hidden_state_layer_ids"]) * cfg["target_hidden_size"]
    expected = {
        # Layer 0 attention reads [input embeds, hidden state] concatenated.
        "midlayer.self_attn.q_proj.weight": ([q_size, 2 * hidden], "BF16"),
        "midlayer.self_attn.k_proj.weight": ([kv_size, 2 * hidden], "BF16"),
        "midlayer.self_attn.v_proj.weight": ([kv_size, 2 * hidden], "BF16"),
        "midlayer.self_attn.o_proj.weight": ([hidden, q_size], "BF16"),
        "midlayer.mlp.gate_proj.weight": ([inter, hidden], "BF16"),
        "midlayer.mlp.up_proj.weight": ([inter, hidden], "BF16"),
        "midlayer.mlp.down_proj.weight": ([hidden, inter], "BF16"),
        "midlayer.input_layernorm.weight": ([hidden], "BF16"),
        "midlayer.hidden_norm.weight": ([hidden], "BF16"),
        "midlayer.post_attention_layernorm.weight": ([hidden], "BF16"),
        "fc.weight": ([hidden, fc_in], "BF16"),
        "norm.weight": ([hidden], "BF16"),
        "lm_head.weight": ([cfg["draft_vocab_size"], hidden], "BF16"),
        "d2t": ([cfg["draft_vocab_size"]], "I64"),
        "t2d": ([cfg["vocab_size"]], "BOOL"),
    }
    header, _ = read_safetensors(models / name / "model.safetensors")
    actual = {key: (info["shape"], info["dtype"]) for key, info in header.items() if key != "__metadata__"}
    assert actual == expected


def test_lm_heads(models):
    _, target = read_safetensors(models / "tiny-llama" / "model.safetensors")
    _, accept = read_safetensors(models / "eagle3-accept" / "model.safetensors")
    _, random = read_safetensors(models / "eagle3-random" / "model.safetensors")
    assert not target["lm_head.weight"].any()
    assert not accept["lm_head.weight"].any()
    assert np.count_nonzero(random["lm_head.weight"]) > 0.99 * random["lm_head.weight"].size
    assert target["model.embed_tokens.weight"].std() > 0.01  # the rest of the target is random


def test_draft_to_target_mappings(models):
    vocab = config(models, "tiny-llama")["vocab_size"]
    _, accept = read_safetensors(models / "eagle3-accept" / "model.safetensors")
    _, random = read_safetensors(models / "eagle3-random" / "model.safetensors")
    assert accept["d2t"][0] == 0, "draft id 0 must map to target id 0"
    for tensors in (accept, random):
        target_ids = np.arange(len(tensors["d2t"])) + tensors["d2t"]
        assert len(set(target_ids.tolist())) == len(target_ids)
        assert target_ids.min() >= 0 and target_ids.max() < vocab
        assert np.array_equal(np.flatnonzero(tensors["t2d"]), np.sort(target_ids))
    assert 0 not in (np.arange(len(random["d2t"])) + random["d2t"])


def test_token_zero_is_printable_and_specials_on_top(models):
    tokenizer = Tokenizer.from_file(str(models / "tiny-llama" / "tokenizer.json"))
    cfg = config(models, "tiny-llama")
    assert tokenizer.get_vocab_size() == cfg["vocab_size"]
    special_ids = sorted(tokenizer.token_to_id(token) for token in builder.SPECIAL_TOKENS)
    assert special_ids == list(range(cfg["vocab_size"] - len(special_ids), cfg["vocab_size"]))
    assert 0 not in special_ids and cfg["eos_token_id"] != 0
    text = tokenizer.decode([0] * 8)
    assert text.strip() and text.isprintable()
    tokenizer_config = json.loads((models / "tiny-llama" / "tokenizer_config.json").read_text())
    assert tokenizer.token_to_id(tokenizer_config["eos_token"]) == cfg["eos_token_id"]
    assert tokenizer.token_to_id(tokenizer_config["bos_token"]) == cfg["bos_token_id"]
    assert "<|im_start|>" in tokenizer_config["chat_template"]


def test_bf16_rounds_to_nearest_even():
    values = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.0, 1 + 2**-8 + 2**-20], dtype=np.float32)
    bits = np.frombuffer(builder.bf16_bytes(values), dtype="<u2")
    assert bits.tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC000, 0x3F81]


def test_deterministic(models, tmp_path):
    builder.build(tmp_path)
    assert tree_hashes(tmp_path) == tree_hashes(models)


def test_rerun_skips_and_repairs(tmp_path, capsys):
    builder.build(tmp_path)
    built = tree_hashes(tmp_path)
    weights = tmp_path / "tiny-llama" / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    capsys.readouterr()

    builder.build(tmp_path)
    assert "up to date" in capsys.readouterr().out
    assert weights.stat().st_mtime_ns == mtime

    weights.write_bytes(b"corrupt")
    builder.build(tmp_path)
    assert capsys.readouterr().out.count("built") == 4
    assert tree_hashes(tmp_path) == built

    builder.build(tmp_path, force=True)
    assert capsys.readouterr().out.count("built") == 4
