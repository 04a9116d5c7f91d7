"""Unit tests for library/eagle3_checkpoint.py.

Config-level checks run on real published drafter configs, used as they are (tests/fixtures/drafters,
sources in SOURCES.md). Tensor-level checks run on tiny drafters built from a shrunken copy of each real
config, and on the repo's own simulated drafters (sim/build_models.py).
"""

import copy
import hashlib
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import eagle3_checkpoint as ec
import numpy as np
import pytest
import script_module

REPO = Path(__file__).resolve().parents[2]
DRAFTERS = REPO / "tests" / "fixtures" / "drafters"
BUILDER = REPO / "sim" / "build_models.py"
REAL = sorted(path.name for path in DRAFTERS.iterdir() if (path / "config.json").is_file())

FACT_KEYS = {
    "path",
    "config",
    "valid",
    "problems",
    "warnings",
    "format",
    "architecture",
    "model_type",
    "hidden_size",
    "vocab_size",
    "draft_vocab_size",
    "target_hidden_size",
    "aux_layer_ids",
    "aux_layer_ids_source",
    "norm_before_residual",
    "max_position_embeddings",
    "speculative_tokens",
    "layer_prefix",
    "has_d2t",
    "num_tensors",
    "total_bytes",
    "files",
    "target",
    "vllm_version",
}
# DeepSeek-V3/R1 and Kimi-K2/K2.5 targets: 61 layers of hidden size 7168 (SOURCES.md).
DEEPSEEK_LAYERS = 61

# Test scale: every drafter keeps its config's keys and nesting, with these sizes.
SMALL_HIDDEN = 64
SMALL_VOCAB = 512
SMALL_DRAFT_VOCAB = 128
SMALL_SIZES = {"intermediate_size": 96, "num_attention_heads": 4, "head_dim": 16}
SMALL_MLA = {
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
}


# Only its write_safetensors (float32 -> BF16, int64 -> I64, bool -> BOOL).
builder = script_module.load(BUILDER, "build_sim_models")


def real_config(name):
    return json.loads((DRAFTERS / name / "config.json").read_text())


def shrink(config):
    """A copy of a real drafter config at test scale: same keys and nesting, small sizes."""
    small = copy.deepcopy(config)
    layer = small["transformer_layer_config"] if "speculators_model_type" in small else small
    full_vocab = layer["vocab_size"]
    kv_equals_heads = layer.get("num_key_value_heads") == layer.get("num_attention_heads")
    layer["hidden_size"] = SMALL_HIDDEN
    layer["vocab_size"] = SMALL_VOCAB
    for key, value in SMALL_SIZES.items():
        layer[key] = value
    layer["num_key_value_heads"] = layer["num_attention_heads"] if kv_equals_heads else 2
    for key, value in SMALL_MLA.items():
        if key in layer:
            layer[key] = value
    if small.get("draft_vocab_size"):
        small["draft_vocab_size"] = (
            SMALL_VOCAB if small["draft_vocab_size"] == full_vocab else SMALL_DRAFT_VOCAB
        )
    if small.get("target_hidden_size"):
        small["target_hidden_size"] = SMALL_HIDDEN
    return small


def drafter_tensors(config, drop=(), **replace):
    """Zero tensors with the layout vLLM loads for `config` (flat: midlayer.*, speculators: layers.0.*)."""
    summary = ec.read_drafter_config(config)
    assert summary["problems"] == []
    hidden, vocab = summary["hidden_size"], summary["vocab_size"]
    draft_vocab, target_hidden = summary["draft_vocab_size"], summary["target_hidden_size"]
    n_aux = len(summary["aux_layer_ids"] or [0, 0, 0])
    layer = config.get("transformer_layer_config", config)
    heads, kv_heads, head_dim = layer["num_attention_heads"], layer["num_key_value_heads"], layer["head_dim"]
    inter = layer["intermediate_size"]
    prefix = "layers.0." if summary["format"] == "speculators" else "midlayer."

    def zeros(*shape):
        return np.zeros(shape, dtype=np.float32)

    tensors = {}
    if summary["attention"] == "mla":
        q_rank, kv_rank = layer["q_lora_rank"], layer["kv_lora_rank"]
        nope, rope, v_dim = layer["qk_nope_head_dim"], layer["qk_rope_head_dim"], layer["v_head_dim"]
        attention = {
            "q_a_proj.weight": zeros(q_rank, 2 * hidden),
            "q_a_layernorm.weight": zeros(q_rank),
            "q_b_proj.weight": zeros(heads * (nope + rope), q_rank),
            "kv_a_proj_with_mqa.weight": zeros(kv_rank + rope, 2 * hidden),
            "kv_a_layernorm.weight": zeros(kv_rank),
            "kv_b_proj.weight": zeros(heads * (nope + v_dim), kv_rank),
            "o_proj.weight": zeros(hidden, heads * v_dim),
        }
    else:
        attention = {
            "q_proj.weight": zeros(heads * head_dim, 2 * hidden),
            "k_proj.weight": zeros(kv_heads * head_dim, 2 * hidden),
            "v_proj.weight": zeros(kv_heads * head_dim, 2 * hidden),
            "o_proj.weight": zeros(hidden, heads * head_dim),
        }
    tensors.update({f"{prefix}self_attn.{name}": value for name, value in attention.items()})
    tensors.update(
        {
            f"{prefix}mlp.gate_proj.weight": zeros(inter, hidden),
            f"{prefix}mlp.up_proj.weight": zeros(inter, hidden),
            f"{prefix}mlp.down_proj.weight": zeros(hidden, inter),
            f"{prefix}input_layernorm.weight": zeros(hidden),
            f"{prefix}hidden_norm.weight": zeros(hidden),
            f"{prefix}post_attention_layernorm.weight": zeros(hidden),
            "fc.weight": zeros(hidden, n_aux * target_hidden),
            "norm.weight": zeros(hidden),
            "lm_head.weight": zeros(draft_vocab, hidden),
        }
    )
    if draft_vocab < vocab:
        tensors["d2t"] = np.zeros(draft_vocab, dtype=np.int64)
        tensors["t2d"] = np.zeros(vocab, dtype=bool)
    for name in drop:
        del tensors[name]
    tensors.update(replace)
    return tensors


def make_drafter(directory, config, tensors=None):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    builder.write_safetensors(
        directory / "model.safetensors", drafter_tensors(config) if tensors is None else tensors
    )
    return directory


def write_target(path, hidden_size=SMALL_HIDDEN, layers=DEEPSEEK_LAYERS, **extra):
    path.write_text(json.dumps(dict({"hidden_size": hidden_size, "num_hidden_layers": layers}, **extra)))
    return path


def facts_for(path, **kwargs):
    return ec.inspect_drafter(str(path), **{key: value for key, value in kwargs.items() if value is not None})


@pytest.fixture(scope="module")
def sim_models(tmp_path_factory):
    """The repo's simulated models, built the way the README says: sim/build_models.py --out DIR."""
    out = tmp_path_factory.mktemp("sim-models")
    subprocess.run([sys.executable, str(BUILDER), "--out", str(out)], check=True, capture_output=True)
    return out


@pytest.fixture
def sim_copy(sim_models, tmp_path):
    """A private copy of eagle3-accept to damage."""
    return Path(shutil.copytree(sim_models / "eagle3-accept", tmp_path / "eagle3-accept"))


def rewrite_header(path, mutate):
    """Re-write a safetensors file with mutate(header) and the same data bytes."""
    blob = path.read_bytes()
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + length])
    mutate(header)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + blob[8 + length :])


def rewrite_config(directory, **changes):
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))


# --- real drafter configs, as published ---------------------------------------------------------------------


def test_every_fixture_is_listed_in_sources():
    sources = (DRAFTERS / "SOURCES.md").read_text()
    assert len(REAL) == 8
    for name in REAL:
        assert f"`{name}/config.json`" in sources, name


@pytest.mark.parametrize(
    "name, fmt, architecture, hidden, vocab, draft_vocab, aux, source",
    [
        (
            "specforge-kimi-k2",
            "flat",
            "LlamaForCausalLMEagle3",
            7168,
            163840,
            32000,
            [2, 30, 58],
            "eagle_config",
        ),
        (
            "specforge-kimi-k25",
            "flat",
            "LlamaForCausalLMEagle3",
            7168,
            163840,
            32000,
            [2, 30, 58],
            "eagle_config",
        ),
        (
            "specforge-deepseek-v3-671b",
            "flat",
            "LlamaForCausalLMEagle3",
            7168,
            129280,
            32000,
            [1, 29, 57],
            "eagle_config",
        ),
        ("specforge-llama3-8b", "flat", "LlamaForCausalLMEagle3", 4096, 128256, 32000, None, None),
        ("specforge-deepseek-v2-lite", "flat", "LlamaForCausalLMEagle3", 2048, 102400, 32000, None, None),
        (
            "aq-medai-kimi-k25",
            "flat",
            "LlamaForCausalLMEagle3",
            7168,
            163840,
            32000,
            [2, 30, 58],
            "eagle_config",
        ),
        (
            "k-l-lambda-kimi-k25-mla",
            "flat",
            "Eagle3DeepseekV2ForCausalLM",
            7168,
            163840,
            163840,
            [2, 30, 58],
            "eagle_config",
        ),
        (
            "nm-testing-llama3.1-8b-speculators",
            "speculators",
            "Eagle3Speculator",
            4096,
            128256,
            32000,
            None,
            None,
        ),
    ],
)
def test_real_config_summary(name, fmt, architecture, hidden, vocab, draft_vocab, aux, source):
    summary = ec.read_drafter_config(real_config(name))
    assert summary["problems"] == []
    assert summary["format"] == fmt
    assert summary["architecture"] == architecture
    assert (summary["hidden_size"], summary["vocab_size"], summary["draft_vocab_size"]) == (
        hidden,
        vocab,
        draft_vocab,
    )
    assert summary["target_hidden_size"] == hidden  # none of them sets it (or sets it to null)
    assert summary["aux_layer_ids"] == aux
    assert summary["aux_layer_ids_source"] == source


def test_speculators_config_details():
    summary = ec.read_drafter_config(real_config("nm-testing-llama3.1-8b-speculators"))
    assert summary["speculative_tokens"] == 5
    assert summary["model_type"] == "llama"
    assert summary["max_position_embeddings"] == 2048
    assert summary["norm_before_residual"] is False
    assert summary["attention"] == "llama"


def test_mla_drafter_attention_kind():
    summary = ec.read_drafter_config(real_config("k-l-lambda-kimi-k25-mla"))
    assert summary["attention"] == "mla"
    assert summary["model_type"] == "kimi_k2"
    assert summary["rope"]["type"] == "yarn"


def warnings_for(name, **kwargs):
    return ec.drafter_warnings(ec.read_drafter_config(real_config(name)), **kwargs)


@pytest.mark.parametrize(
    "name", [n for n in REAL if n not in ("specforge-llama3-8b", "specforge-deepseek-v2-lite")]
)
def test_nested_aux_ids_warning(name):
    found = [w for w in warnings_for(name, version=(0, 33, 0)) if "only under eagle_config" in w]
    if name == "nm-testing-llama3.1-8b-speculators":
        assert found == []
    else:
        assert len(found) == 1
        assert "move eagle_aux_hidden_state_layer_ids to the top level of config.json" in found[0]


@pytest.mark.parametrize("name", REAL)
def test_norm_before_residual_warning(name):
    found = [w for w in warnings_for(name, version=(0, 33, 0)) if w.startswith("norm_before_residual")]
    # Only the speculators config writes it (false); every SpecForge-style flat config leaves it out.
    assert len(found) == (0 if name == "nm-testing-llama3.1-8b-speculators" else 1)
    if found:
        assert "write it explicitly" in found[0]


def test_yarn_mscale_warning_on_a_llama_drafter():
    old = [w for w in warnings_for("specforge-deepseek-v2-lite", version=(0, 29, 1)) if "yarn" in w]
    assert len(old) == 1
    # factor 40: plain YaRN scales cos/sin by 0.1 ln 40 + 1 = 1.37, so attention logits by 1.87.
    assert "vLLM 0.29.1, older than 0.30.0," in old[0]
    assert "~1.37x, attention logits ~1.9x" in old[0]
    assert "upgrade vLLM to 0.30.0 or newer" in old[0] and "drop mscale/mscale_all_dim" in old[0]
    assert [w for w in warnings_for("specforge-deepseek-v2-lite", version=(0, 30, 0)) if "yarn" in w] == []
    unknown = [w for w in warnings_for("specforge-deepseek-v2-lite") if "yarn" in w]
    assert len(unknown) == 1 and "vllm_version not given" in unknown[0]


def test_yarn_mscale_warning_kimi_factor():
    config = real_config("specforge-kimi-k2")
    config["rope_scaling"] = real_config("k-l-lambda-kimi-k25-mla")["rope_scaling"]  # Kimi's YaRN, factor 64
    found = [
        w for w in ec.drafter_warnings(ec.read_drafter_config(config), version=(0, 29, 0)) if "yarn" in w
    ]
    assert len(found) == 1 and "~1.42x, attention logits ~2.0x" in found[0]


def test_no_yarn_warning_for_the_mla_drafter():
    # DeepseekV2's own YaRN honours mscale/mscale_all_dim; only Llama drafters are affected.
    assert [w for w in warnings_for("k-l-lambda-kimi-k25-mla", version=(0, 29, 0)) if "yarn" in w] == []


@pytest.mark.parametrize(
    "version, warned",
    [
        ((0, 18, 1), ["norm_before_fc", "norm_output"]),
        ((0, 19, 0), ["norm_output"]),
        ((0, 25, 0), []),
        (None, ["norm_before_fc", "norm_output"]),
    ],
)
def test_norm_flags_need_new_vllm(version, warned):
    config = real_config("nm-testing-llama3.1-8b-speculators")
    config.update(norm_before_fc=True, norm_output=True)  # what speculators >= 0.7 trains with
    found = ec.drafter_warnings(ec.read_drafter_config(config), version=version)
    assert [w.split(" ", 1)[0] for w in found] == [
        {"norm_before_fc": "norm_before_fc", "norm_output": "norm_output/fc_norm"}[flag] for flag in warned
    ]
    assert all("drops it silently" in w and "upgrade vLLM" in w for w in found)


def test_fc_norm_counts_as_norm_output():
    config = real_config("specforge-llama3-8b")
    config.update(fc_norm=True, norm_before_residual=True)
    assert [
        w.split(" ", 1)[0] for w in ec.drafter_warnings(ec.read_drafter_config(config), version=(0, 24, 0))
    ] == ["norm_output/fc_norm"]


@pytest.mark.parametrize(
    "name, served, warned",
    [
        ("aq-medai-kimi-k25", 262144, False),
        ("specforge-kimi-k2", 262144, True),
        ("specforge-kimi-k2", 131072, False),
        ("specforge-llama3-8b", 8192, True),
        ("nm-testing-llama3.1-8b-speculators", 4096, True),
        ("nm-testing-llama3.1-8b-speculators", None, False),
    ],
)
def test_served_length_warning(name, served, warned):
    found = [w for w in warnings_for(name, served_max_model_len=served) if "max_position_embeddings" in w]
    assert bool(found) == warned
    if found:
        assert f"below the served max_model_len {served}" in found[0]


def test_pipeline_parallel_warning():
    assert not [w for w in warnings_for("aq-medai-kimi-k25", pipeline_parallel_size=1) if "pipeline" in w]
    found = [w for w in warnings_for("aq-medai-kimi-k25", pipeline_parallel_size=2) if "pipeline" in w]
    assert len(found) == 1 and "DeepseekV3 target" in found[0]


def test_aux_ids_top_level_and_nested_disagree():
    config = real_config("specforge-kimi-k2")
    config["eagle_aux_hidden_state_layer_ids"] = [1, 29, 57]
    summary = ec.read_drafter_config(config)
    assert summary["aux_layer_ids"] == [1, 29, 57]
    assert summary["aux_layer_ids_source"] == "top-level"
    found = [w for w in ec.drafter_warnings(summary) if "eagle_aux_hidden_state_layer_ids is" in w]
    assert len(found) == 1 and "vLLM uses the top-level ids" in found[0]


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"architectures": ["LlamaForCausalLM"]}, "unknown architecture 'LlamaForCausalLM'"),
        ({"architectures": []}, "config.json names no architecture"),
        ({"hidden_size": None}, "config.json has no hidden_size"),
        ({"vocab_size": "big"}, "config.json vocab_size is 'big', not a positive integer"),
        ({"draft_vocab_size": 200000}, "draft_vocab_size 200000 is larger than vocab_size 163840"),
        ({"eagle_aux_hidden_state_layer_ids": []}, "eagle_aux_hidden_state_layer_ids is [], not a non-empty"),
        (
            {"eagle_aux_hidden_state_layer_ids": [2, "30"]},
            "eagle_aux_hidden_state_layer_ids is [2, '30'], not a",
        ),
    ],
)
def test_config_problems(change, reason):
    config = real_config("specforge-kimi-k2")
    config.update(change)
    problems = ec.read_drafter_config(config)["problems"]
    assert len(problems) == 1 and problems[0].startswith(reason), problems


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"speculators_model_type": "eagle"}, "speculators_model_type is 'eagle', not 'eagle3'"),
        ({"transformer_layer_config": None}, "speculators config has no transformer_layer_config"),
        (
            {"speculators_config": {"proposal_methods": []}},
            "speculators_config.proposal_methods[0].speculative_tokens",
        ),
    ],
)
def test_speculators_config_problems(change, reason):
    config = real_config("nm-testing-llama3.1-8b-speculators")
    config.update(change)
    problems = ec.read_drafter_config(config)["problems"]
    assert problems and problems[0].startswith(reason), problems


def test_target_config_multimodal_uses_text_config():
    target = {"model_type": "kimi_k25", "text_config": {"hidden_size": 7168, "num_hidden_layers": 61}}
    assert ec.read_target_config(target) == {
        "hidden_size": 7168,
        "num_hidden_layers": 61,
        "model_type": "kimi_k25",
    }


@pytest.mark.parametrize(
    "text, version",
    [
        ("0.32.0+cpu", (0, 32, 0)),
        ("0.33.0", (0, 33, 0)),
        ("v0.19.0rc1", (0, 19, 0)),
        ("0.25.1.dev3+g1234", (0, 25, 1)),
        ("1.0", (1, 0, 0)),
    ],
)
def test_parse_vllm_version(text, version):
    assert ec.parse_vllm_version(text) == version


@pytest.mark.parametrize("text", ["", "latest", "main", "x0.3"])
def test_parse_vllm_version_rejects(text):
    with pytest.raises(ValueError, match="is not a version like 0.33.0"):
        ec.parse_vllm_version(text)


# --- tiny drafters built from the real configs --------------------------------------------------------------


@pytest.mark.parametrize("name", REAL)
def test_tiny_copy_of_every_real_drafter_is_valid(tmp_path, name):
    config = shrink(real_config(name))
    drafter = make_drafter(tmp_path / name, config)
    target = write_target(tmp_path / "target.json")
    facts = facts_for(drafter, target_config=str(target), version=(0, 33, 0))
    assert facts["problems"] == []
    assert facts["valid"] is True
    assert facts["hidden_size"] == SMALL_HIDDEN
    assert facts["layer_prefix"] == ("layers.0." if facts["format"] == "speculators" else "midlayer.")
    assert facts["has_d2t"] == (facts["draft_vocab_size"] < facts["vocab_size"])
    assert facts["num_tensors"] == len(drafter_tensors(config))
    assert facts["target"] == {
        "config": str(target),
        "hidden_size": SMALL_HIDDEN,
        "num_hidden_layers": DEEPSEEK_LAYERS,
        "model_type": None,
    }
    # The warnings come from the config, whatever its scale.
    assert facts["warnings"] == ec.drafter_warnings(ec.read_drafter_config(config), version=(0, 33, 0))


def test_tiny_drafter_sharded_with_index(tmp_path):
    config = shrink(real_config("aq-medai-kimi-k25"))
    drafter = tmp_path / "sharded"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps(config))
    tensors = drafter_tensors(config)
    names = sorted(tensors)
    weight_map = {}
    for number, part in enumerate((names[::2], names[1::2])):
        shard = f"model-{number + 1:05d}-of-00002.safetensors"
        builder.write_safetensors(drafter / shard, {name: tensors[name] for name in part})
        weight_map.update(dict.fromkeys(part, shard))
    (drafter / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    facts = facts_for(drafter)
    assert facts["problems"] == []
    assert facts["num_tensors"] == len(tensors)
    assert [entry["name"] for entry in facts["files"]] == [
        "config.json",
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    (drafter / "model-00002-of-00002.safetensors").unlink()
    problems = facts_for(drafter)["problems"]
    assert problems == [
        "model.safetensors.index.json: lists shard 'model-00002-of-00002.safetensors', which does not exist"
    ]


def tiny(tmp_path, name="aq-medai-kimi-k25", **tensor_changes):
    config = shrink(real_config(name))
    return make_drafter(tmp_path / "drafter", config, drafter_tensors(config, **tensor_changes)), config


def test_missing_lm_head(tmp_path):
    drafter, _config = tiny(tmp_path, drop=["lm_head.weight"])
    assert facts_for(drafter)["problems"] == ["missing tensor(s): lm_head.weight"]


def test_missing_attention_and_mlp(tmp_path):
    drafter, _config = tiny(
        tmp_path, drop=["midlayer.self_attn.k_proj.weight", "midlayer.mlp.up_proj.weight"]
    )
    assert facts_for(drafter)["problems"] == [
        "missing tensor(s): midlayer.self_attn.k_proj.weight, midlayer.mlp.up_proj.weight"
    ]


def test_mla_drafter_needs_some_self_attn(tmp_path):
    config = shrink(real_config("k-l-lambda-kimi-k25-mla"))
    attention = [name for name in drafter_tensors(config) if ".self_attn." in name]
    drafter = make_drafter(tmp_path / "mla", config, drafter_tensors(config, drop=attention))
    assert facts_for(drafter)["problems"] == ["missing tensor(s): midlayer.self_attn.*"]


def test_no_layer_tensors(tmp_path):
    config = shrink(real_config("specforge-llama3-8b"))
    layer = [name for name in drafter_tensors(config) if name.startswith("midlayer.")]
    drafter = make_drafter(tmp_path / "d", config, drafter_tensors(config, drop=layer))
    assert facts_for(drafter)["problems"] == [
        "missing tensor(s): midlayer.* or layers.0.* (the drafter layer)"
    ]


def test_both_layer_prefixes_collide(tmp_path):
    config = shrink(real_config("specforge-llama3-8b"))
    extra = {"layers.0.input_layernorm.weight": np.zeros(SMALL_HIDDEN, dtype=np.float32)}
    drafter = make_drafter(tmp_path / "d", config, drafter_tensors(config, **extra))
    problems = facts_for(drafter)["problems"]
    assert len(problems) == 1 and "both midlayer. and layers.0." in problems[0]


def test_wrong_fc_shape(tmp_path):
    wrong = np.zeros((SMALL_HIDDEN, 2 * SMALL_HIDDEN), dtype=np.float32)
    drafter, _config = tiny(tmp_path, **{"fc.weight": wrong})
    assert facts_for(drafter)["problems"] == [
        f"fc.weight is [{SMALL_HIDDEN}, {2 * SMALL_HIDDEN}], expected [{SMALL_HIDDEN}, {3 * SMALL_HIDDEN}]"
        f" (hidden_size, 3 aux layers x target_hidden_size {SMALL_HIDDEN})"
    ]


def test_fc_shape_follows_the_number_of_aux_layers(tmp_path):
    config = shrink(real_config("specforge-kimi-k2"))
    config["eagle_aux_hidden_state_layer_ids"] = [2, 16, 30, 44, 58]  # five aux layers: fc takes 5 x hidden
    drafter = make_drafter(tmp_path / "five", config)
    assert facts_for(drafter)["problems"] == []
    config["eagle_aux_hidden_state_layer_ids"] = [2, 30]
    (drafter / "config.json").write_text(json.dumps(config))
    problems = facts_for(drafter)["problems"]
    assert problems == [
        f"fc.weight is [{SMALL_HIDDEN}, {5 * SMALL_HIDDEN}], expected [{SMALL_HIDDEN}, {2 * SMALL_HIDDEN}]"
        f" (hidden_size, 2 aux layers x target_hidden_size {SMALL_HIDDEN})"
    ]


def test_qkv_must_take_twice_the_hidden_size(tmp_path):
    wrong = np.zeros((64, SMALL_HIDDEN), dtype=np.float32)
    drafter, _config = tiny(tmp_path, **{"midlayer.self_attn.q_proj.weight": wrong})
    problems = facts_for(drafter)["problems"]
    assert problems == [
        f"midlayer.self_attn.q_proj.weight is [64, {SMALL_HIDDEN}]: layer 0 takes [embeddings, hidden state],"
        f" expected {2 * SMALL_HIDDEN} inputs (2 x hidden_size)"
    ]


def test_lm_head_rows_are_the_draft_vocab(tmp_path):
    wrong = np.zeros((SMALL_VOCAB, SMALL_HIDDEN), dtype=np.float32)
    drafter, _config = tiny(tmp_path, **{"lm_head.weight": wrong})
    assert facts_for(drafter)["problems"] == [
        f"lm_head.weight is [{SMALL_VOCAB}, {SMALL_HIDDEN}], expected [{SMALL_DRAFT_VOCAB}, {SMALL_HIDDEN}]"
        " (draft_vocab_size, hidden_size)"
    ]


def test_draft_vocab_without_d2t(tmp_path):
    drafter, _config = tiny(tmp_path, drop=["d2t", "t2d"])
    facts = facts_for(drafter)
    assert facts["has_d2t"] is False
    assert facts["problems"] == [
        f"draft_vocab_size {SMALL_DRAFT_VOCAB} < vocab_size {SMALL_VOCAB} but there is no d2t tensor:"
        " vLLM cannot map draft token ids to target ids"
    ]


def test_d2t_shape_and_dtype(tmp_path):
    drafter, _config = tiny(tmp_path, d2t=np.zeros(SMALL_VOCAB, dtype=np.float32))
    assert facts_for(drafter)["problems"] == [
        f"d2t is [{SMALL_VOCAB}], expected [{SMALL_DRAFT_VOCAB}] (draft_vocab_size)",
        "d2t is BF16, expected an integer dtype (I64 offsets)",
    ]


def test_full_vocab_drafter_needs_no_d2t(tmp_path):
    config = shrink(real_config("k-l-lambda-kimi-k25-mla"))
    assert config["draft_vocab_size"] == config["vocab_size"] == SMALL_VOCAB
    facts = facts_for(make_drafter(tmp_path / "mla", config))
    assert facts["problems"] == [] and facts["has_d2t"] is False


def test_aux_id_beyond_the_target(tmp_path):
    drafter, _config = tiny(tmp_path, name="specforge-kimi-k2")  # aux [2, 30, 58]
    target = write_target(tmp_path / "short.json", layers=30)
    assert facts_for(drafter, target_config=str(target), version=(0, 33, 0))["problems"] == [
        "aux layer id(s) [58] not below the target's num_hidden_layers 30: vLLM captures nothing for them"
        " (vLLM issue #46788)"
    ]


@pytest.mark.parametrize(
    "version, missing", [(None, "[30, 58]"), ((0, 24, 0), "[30, 58]"), ((0, 25, 0), "[58]")]
)
def test_aux_id_equal_to_the_target_layers(tmp_path, version, missing):
    # vLLM >= 0.25 captures the final hidden state for id == num_hidden_layers; older vLLM captures nothing.
    drafter, _config = tiny(tmp_path, name="specforge-kimi-k2")
    target = write_target(tmp_path / "t.json", layers=30)
    problems = facts_for(drafter, target_config=str(target), version=version)["problems"]
    assert problems == [
        f"aux layer id(s) {missing} not below the target's num_hidden_layers 30: vLLM captures nothing for"
        " them (vLLM issue #46788)"
    ]


def test_target_hidden_size_mismatch(tmp_path):
    drafter, _config = tiny(tmp_path)
    target = write_target(tmp_path / "t.json", hidden_size=7168)
    assert facts_for(drafter, target_config=str(target))["problems"] == [
        f"drafter target_hidden_size {SMALL_HIDDEN} (hidden_size when unset) differs from the target's"
        " hidden_size 7168: fc.weight cannot take this target's hidden states"
    ]


def test_explicit_target_hidden_size(tmp_path):
    config = shrink(real_config("specforge-llama3-8b"))
    config["target_hidden_size"] = 96  # a drafter narrower than its target
    drafter = make_drafter(tmp_path / "d", config)
    target = write_target(tmp_path / "t.json", hidden_size=96, layers=32)
    facts = facts_for(drafter, target_config=str(target))
    assert facts["problems"] == []
    assert facts["target_hidden_size"] == 96


@pytest.mark.parametrize(
    "content, reason",
    [
        (None, "does not exist"),
        ("{oops", "is not valid JSON"),
        ("[]", "is a JSON list, not an object"),
        ('{"hidden_size": 64}', "has no usable num_hidden_layers (None)"),
    ],
)
def test_bad_target_config(tmp_path, content, reason):
    drafter, _config = tiny(tmp_path)
    target = tmp_path / "target.json"
    if content is not None:
        target.write_text(content)
    problems = facts_for(drafter, target_config=str(target))["problems"]
    assert len(problems) == 1 and problems[0].startswith(f"target config {target}") and reason in problems[0]


def test_missing_config_json(tmp_path):
    drafter, _config = tiny(tmp_path)
    (drafter / "config.json").unlink()
    facts = facts_for(drafter)
    assert facts["problems"] == ["config.json does not exist"]
    assert facts["format"] is None
    assert facts["num_tensors"] > 0  # the weights are still read


def test_invalid_config_json(tmp_path):
    drafter, _config = tiny(tmp_path)
    (drafter / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"],')
    problems = facts_for(drafter)["problems"]
    assert len(problems) == 1 and problems[0].startswith("config.json is not valid JSON: ")


def test_no_weights(tmp_path):
    drafter = tmp_path / "empty"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps(shrink(real_config("specforge-llama3-8b"))))
    assert facts_for(drafter)["problems"] == [
        "no weights: no *.safetensors file and no model.safetensors.index.json"
    ]
    (drafter / "pytorch_model.bin").write_bytes(b"\x80\x02pickle")
    problems = facts_for(drafter)["problems"]
    assert (
        len(problems) == 1
        and "only pickled ones" in problems[0]
        and "convert them to safetensors" in problems[0]
    )
    (drafter / "pytorch_model.bin").unlink()
    builder.write_safetensors(drafter / "model.safetensors", {})
    assert facts_for(drafter)["problems"] == ["no weights: the safetensors files hold no tensors"]


def test_not_a_directory(tmp_path):
    assert facts_for(tmp_path / "nowhere")["problems"] == ["no such directory"]
    (tmp_path / "file").write_text("")
    assert facts_for(tmp_path / "file")["problems"] == ["not a directory"]


# --- the repo's simulated drafters and damaged copies of them -----------------------------------------------


@pytest.mark.parametrize("name", ["eagle3-accept", "eagle3-random"])
def test_sim_drafters_are_valid(sim_models, name):
    target = sim_models / "tiny-llama" / "config.json"
    facts = facts_for(
        sim_models / name, target_config=str(target), version=(0, 33, 0), served_max_model_len=512
    )
    assert facts["problems"] == []
    assert facts["warnings"] == []
    assert facts["valid"] is True
    assert facts["format"] == "flat"
    assert facts["architecture"] == "LlamaForCausalLMEagle3"
    assert (facts["hidden_size"], facts["vocab_size"], facts["draft_vocab_size"]) == (128, 2048, 1024)
    assert facts["target_hidden_size"] == 128
    assert facts["aux_layer_ids"] == [1, 2, 3]
    assert facts["aux_layer_ids_source"] == "top-level"
    assert facts["norm_before_residual"] is False
    assert facts["layer_prefix"] == "midlayer."
    assert facts["has_d2t"] is True
    assert facts["num_tensors"] == 15
    size = (sim_models / name / "model.safetensors").stat().st_size
    (header_length,) = struct.unpack("<Q", (sim_models / name / "model.safetensors").read_bytes()[:8])
    assert facts["total_bytes"] == size - 8 - header_length
    assert facts["target"]["num_hidden_layers"] == 4
    assert [entry["name"] for entry in facts["files"]] == ["config.json", "model.safetensors"]


def test_sim_drafter_against_the_wrong_target(sim_models, tmp_path):
    target = write_target(tmp_path / "t.json", hidden_size=256, layers=3)
    problems = facts_for(sim_models / "eagle3-accept", target_config=str(target))["problems"]
    assert problems == [
        "drafter target_hidden_size 128 (hidden_size when unset) differs from the target's hidden_size 256:"
        " fc.weight cannot take this target's hidden states",
        "aux layer id(s) [3] not below the target's num_hidden_layers 3: vLLM captures nothing for them"
        " (vLLM issue #46788)",
    ]


def test_sim_drafter_truncated(sim_copy):
    weights = sim_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    facts = facts_for(sim_copy)
    assert facts["problems"] == [
        "model.safetensors: file truncated: the header describes 732160 bytes of tensor data, the file holds"
        " 731160 (1000 missing)"
    ]
    assert facts["valid"] is False
    assert facts["num_tensors"] == 0  # a broken file contributes no tensors, and no tensor checks pile up


def test_sim_drafter_garbage_header_length(sim_copy):
    weights = sim_copy / "model.safetensors"
    garbage = b"\xde\xad\xbe\xef\xde\xad\xbe\xef"
    weights.write_bytes(garbage + weights.read_bytes()[8:])
    (problem,) = facts_for(sim_copy)["problems"]
    (length,) = struct.unpack("<Q", garbage)
    assert problem == f"model.safetensors: header length {length} exceeds the 100000000-byte limit"


def test_sim_drafter_header_not_json(sim_copy):
    weights = sim_copy / "model.safetensors"
    blob = weights.read_bytes()
    (length,) = struct.unpack("<Q", blob[:8])
    weights.write_bytes(blob[:8] + b"<html>404</html>".ljust(length) + blob[8 + length :])
    (problem,) = facts_for(sim_copy)["problems"]
    assert problem.startswith("model.safetensors: header is not valid JSON: Expecting value")


def test_sim_drafter_overlapping_offsets(sim_copy):
    def overlap(header):
        header["midlayer.self_attn.v_proj.weight"]["data_offsets"] = header[
            "midlayer.self_attn.k_proj.weight"
        ]["data_offsets"]

    rewrite_header(sim_copy / "model.safetensors", overlap)
    (problem,) = facts_for(sim_copy)["problems"]
    assert problem.startswith("model.safetensors: tensor 'midlayer.self_attn.")
    assert "overlap tensor 'midlayer.self_attn." in problem


def test_sim_drafter_out_of_range_offsets(sim_copy):
    def move_past_the_end(header):
        begin, end = header["lm_head.weight"]["data_offsets"]
        header["lm_head.weight"]["data_offsets"] = [begin + 10**9, end + 10**9]

    rewrite_header(sim_copy / "model.safetensors", move_past_the_end)
    (problem,) = facts_for(sim_copy)["problems"]
    assert problem.startswith("model.safetensors: tensor 'lm_head.weight' data_offsets end at 100")
    assert "outside the 732160-byte data area" in problem


def test_sim_drafter_aux_id_equal_to_target_layers(sim_models, sim_copy):
    rewrite_config(sim_copy, eagle_aux_hidden_state_layer_ids=[1, 2, 4])
    target = str(sim_models / "tiny-llama" / "config.json")
    assert facts_for(sim_copy, target_config=target, version=(0, 25, 0))["problems"] == []
    assert facts_for(sim_copy, target_config=target, version=(0, 24, 1))["problems"] == [
        "aux layer id(s) [4] not below the target's num_hidden_layers 4: vLLM captures nothing for them"
        " (vLLM issue #46788)"
    ]


# --- the module entry point ---------------------------------------------------------------------------------


def test_main_check_mode_on_a_sim_drafter(sim_models, run_module):
    result = run_module(
        ec,
        {
            "path": str(sim_models / "eagle3-accept"),
            "target_config": str(sim_models / "tiny-llama" / "config.json"),
            "vllm_version": "0.32.0+cpu",
            "served_max_model_len": 512,
            "_ansible_check_mode": True,
        },
    )
    assert result.get("failed") is not True, result
    assert result["changed"] is False
    facts = result["ansible_facts"]["eagle3_checkpoint"]
    assert set(facts) == FACT_KEYS
    assert facts["valid"] is True
    assert facts["vllm_version"] == "0.32.0"
    # The config as read, so that a caller need not read config.json again.
    assert facts["config"] == json.loads((sim_models / "eagle3-accept" / "config.json").read_text())
    assert facts["files"] == [
        {"name": "config.json", "size": (sim_models / "eagle3-accept" / "config.json").stat().st_size},
        {
            "name": "model.safetensors",
            "size": (sim_models / "eagle3-accept" / "model.safetensors").stat().st_size,
        },
    ]


def test_main_checksum(sim_models, run_module):
    drafter = sim_models / "eagle3-random"
    result = run_module(ec, {"path": str(drafter), "checksum": True})
    files = result["ansible_facts"]["eagle3_checkpoint"]["files"]
    assert files == [
        {
            "name": name,
            "size": (drafter / name).stat().st_size,
            "sha256": hashlib.sha256((drafter / name).read_bytes()).hexdigest(),
        }
        for name in ("config.json", "model.safetensors")
    ]


def test_main_fails_with_one_line(tmp_path, run_module):
    drafter, _config = tiny(tmp_path, drop=["lm_head.weight", "d2t"])
    target = write_target(tmp_path / "t.json", layers=30)
    result = run_module(ec, {"path": str(drafter), "target_config": str(target)})
    assert result["failed"] is True
    assert result["changed"] is False
    assert "\n" not in result["msg"]
    assert result["msg"] == (
        f"{drafter}: not a usable EAGLE-3 drafter: missing tensor(s): lm_head.weight;"
        f" draft_vocab_size {SMALL_DRAFT_VOCAB} < vocab_size {SMALL_VOCAB} but there is no d2t tensor:"
        " vLLM cannot map draft token ids to target ids; aux layer id(s) [30, 58] not below the target's"
        " num_hidden_layers 30: vLLM captures nothing for them (vLLM issue #46788)"
    )
    facts = result["ansible_facts"]["eagle3_checkpoint"]  # still in the failed result, for `register`
    assert facts["valid"] is False
    assert len(facts["problems"]) == 3
    assert len(facts["warnings"]) == 2  # aux ids under eagle_config; norm_before_residual not written


def test_main_without_fail_on_problems(tmp_path, run_module):
    drafter, _config = tiny(tmp_path, **{"fc.weight": np.zeros((SMALL_HIDDEN, 7), dtype=np.float32)})
    result = run_module(ec, {"path": str(drafter), "fail_on_problems": False, "_ansible_check_mode": True})
    assert result.get("failed") is not True, result
    assert result["changed"] is False
    facts = result["ansible_facts"]["eagle3_checkpoint"]
    assert facts["valid"] is False
    assert len(facts["problems"]) == 1 and facts["problems"][0].startswith("fc.weight is [64, 7]")


def test_main_warnings_never_fail(tmp_path, run_module):
    drafter = make_drafter(tmp_path / "d", shrink(real_config("specforge-deepseek-v2-lite")))
    result = run_module(
        ec,
        {
            "path": str(drafter),
            "vllm_version": "0.29.0",
            "served_max_model_len": 262144,
            "pipeline_parallel_size": 2,
        },
    )
    assert result.get("failed") is not True, result
    warnings = result["ansible_facts"]["eagle3_checkpoint"]["warnings"]
    assert len(warnings) == 4  # norm_before_residual, yarn mscale, context, pipeline parallel
    assert all("\n" not in warning for warning in warnings)


def test_main_missing_directory(tmp_path, run_module):
    result = run_module(ec, {"path": str(tmp_path / "gone")})
    assert result["failed"] is True
    assert result["msg"] == f"{tmp_path / 'gone'}: not a usable EAGLE-3 drafter: no such directory"


@pytest.mark.parametrize(
    "args, message",
    [
        ({"vllm_version": "nightly"}, "vllm_version 'nightly' is not a version like 0.33.0"),
        ({"pipeline_parallel_size": 0}, "pipeline_parallel_size is 0, must be 1 or more"),
        ({"served_max_model_len": -1}, "served_max_model_len is -1, must be 1 or more"),
    ],
)
def test_main_rejects_bad_parameters(sim_models, run_module, args, message):
    result = run_module(ec, dict({"path": str(sim_models / "eagle3-accept")}, **args))
    assert result["failed"] is True
    assert result["msg"] == message


def test_main_requires_path(run_module):
    result = run_module(ec, {})
    assert result["failed"] is True
    assert "path" in result["msg"]


def test_main_rejects_unknown_option(sim_models, run_module):
    result = run_module(ec, {"path": str(sim_models / "eagle3-accept"), "bogus": 1})
    assert result["failed"] is True
    assert "bogus" in result["msg"]


def test_normalize_writes_the_keys_vllm_reads_and_keeps_the_original(tmp_path, run_module):
    drafter, _config = tiny(tmp_path)  # aux layer ids only under eagle_config, norm_before_residual unsaid
    original = (drafter / "config.json").read_bytes()
    result = run_module(ec, {"path": str(drafter), "normalize": True, "_ansible_check_mode": True})
    assert result["changed"] is True and result["normalized"] is True, result
    assert (drafter / "config.json").read_bytes() == original and not (drafter / "config.orig.json").exists()

    result = run_module(ec, {"path": str(drafter), "normalize": True})
    assert result["changed"] is True and result["normalized"] is True, result
    assert (drafter / "config.orig.json").read_bytes() == original
    written = json.loads((drafter / "config.json").read_text())
    aux = result["ansible_facts"]["eagle3_checkpoint"]["aux_layer_ids"]
    assert aux and written == {**json.loads(original), ec.AUX_IDS_KEY: aux, "norm_before_residual": False}
    assert (drafter / "config.json").read_text().endswith("}\n")

    again = run_module(ec, {"path": str(drafter), "normalize": True})
    assert again["changed"] is False and again["normalized"] is False, again
    facts = again["ansible_facts"]["eagle3_checkpoint"]
    assert not [w for w in facts["warnings"] if "only under eagle_config" in w or w.startswith("norm_before")]
    assert (drafter / "config.orig.json").read_bytes() == original


def test_normalize_leaves_a_checkpoint_with_problems_alone(tmp_path, run_module):
    drafter, _config = tiny(tmp_path, drop=["lm_head.weight"])
    original = (drafter / "config.json").read_bytes()
    result = run_module(ec, {"path": str(drafter), "normalize": True, "fail_on_problems": False})
    assert result["changed"] is False and result["normalized"] is False, result
    assert (drafter / "config.json").read_bytes() == original and not (drafter / "config.orig.json").exists()
