#!/usr/bin/python
"""Ansible facts module: validate an EAGLE-3 drafter directory (config.json + safetensors) without torch."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: eagle3_checkpoint
short_description: Validate an EAGLE-3 drafter checkpoint for vLLM without loading it
description:
  - Reads the drafter's C(config.json) and the headers of its safetensors files (never the tensor data, never
    torch) and returns what it found as the C(eagle3_checkpoint) fact, with a list of problems that would make
    vLLM refuse or mis-load the drafter and a list of warnings that would quietly cost acceptance.
  - Both drafter layouts vLLM loads are understood. C(flat) is a config with C(architectures) one of
    C(LlamaForCausalLMEagle3), C(Eagle3LlamaForCausalLM) or C(Eagle3DeepseekV2ForCausalLM) (MLA);
    C(speculators) is a config with C(speculators_model_type=eagle3), whose sizes are read from
    C(transformer_layer_config).
  - Weights are one C(*.safetensors) file, several, or shards listed in C(model.safetensors.index.json).
    Every file must be a well-formed safetensors file (sane header length, a JSON object header, known
    dtypes, byte sizes that match the shapes, tensors that tile the data area exactly, file not truncated).
  - Problems (each one line) - C(config.json) missing or not JSON; unknown architecture; broken safetensors
    files; no weights; missing layer-0 attention (C(q/k/v/o_proj), or any C(self_attn) tensor for the MLA
    class) or MLP (C(gate/up/down_proj)) tensors under C(midlayer.) or C(layers.0.), or missing
    C(fc.weight), C(norm.weight), C(lm_head.weight); C(fc.weight) not C([hidden, n_aux x target_hidden]);
    q/k/v not taking C(2 x hidden) inputs; C(lm_head.weight) not C([draft_vocab_size, hidden]);
    C(draft_vocab_size < vocab_size) without a C(d2t) tensor; and, with I(target_config), a target hidden
    size different from the drafter's C(target_hidden_size) or an aux layer id the target does not have.
  - Warnings (each says why and how to fix it) - aux layer ids only under C(eagle_config);
    C(norm_before_residual) not written; C(norm_before_fc) before vLLM 0.19 or C(norm_output)/C(fc_norm)
    before vLLM 0.25; a Llama drafter with C(yarn) RoPE carrying C(mscale)/C(mscale_all_dim) before vLLM
    0.30; drafter C(max_position_embeddings) below I(served_max_model_len); I(pipeline_parallel_size) above 1.
    Warnings never fail the task.
  - "With I(normalize), a checkpoint without problems gets the keys vLLM reads explicitly in its
    C(config.json): the aux layer ids at the top level (vLLM does not look under C(eagle_config)) and
    C(norm_before_residual) (its default differs per format). The original is kept as C(config.orig.json)
    (an existing one is left: it is the first original). The new file replaces the old at once. Only then
    is C(changed) true; otherwise the module changes nothing."
options:
  path:
    description: The drafter directory (the one holding C(config.json)).
    type: path
    required: true
  target_config:
    description:
      - The target model's C(config.json). When given, the drafter's C(target_hidden_size) and aux layer ids
        are checked against the target's C(hidden_size) and C(num_hidden_layers) (read from C(text_config)
        for multimodal targets such as Kimi-K2.5).
    type: path
  vllm_version:
    description:
      - The installed vLLM version, for the version-dependent warnings. A local suffix or a pre-release tag is
        ignored (C(0.32.0+cpu) and C(0.32.0rc1) count as 0.32.0).
      - When omitted, every version-dependent warning that could apply is given, saying the version is
        unknown.
    type: str
  served_max_model_len:
    description: The C(max_model_len) the target will be served with; compared to the drafter's context.
    type: int
  pipeline_parallel_size:
    description: The pipeline-parallel size vLLM will run with.
    type: int
    default: 1
  checksum:
    description: Add the sha256 of every file read to C(files) (reads the whole weights once).
    type: bool
    default: false
  normalize:
    description: Write the explicit C(config.json) where it differs (above); meant for a staged copy, not yet
      published.
    type: bool
    default: false
  fail_on_problems:
    description:
      - Fail when there are problems, with a one-line message listing them. With C(false) the task succeeds
        and the problems are only in the fact (C(valid=false)).
    type: bool
    default: true
extends_documentation_fragment:
  - action_common_attributes
  - action_common_attributes.facts
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    platforms: posix
notes:
  - Only safetensors weights are read. A drafter shipped only as C(pytorch_model.bin) is reported as a
    problem (it cannot be checked without torch); convert it to safetensors.
  - An aux layer id equal to the target's C(num_hidden_layers) (the final hidden state) is accepted only
    when I(vllm_version) is 0.25 or newer; older vLLM captures nothing for it.
  - The failure message is one line, the path, then C(not a usable EAGLE-3 drafter), then the problems
    separated by semicolons; the fact is part of the failed result, so C(register) still sees it.
author:
  - specfleet maintainers
"""

EXAMPLES = r"""
- name: Validate the drafter before (re)starting vLLM
  eagle3_checkpoint:
    path: /srv/models/kimi-k2.5-eagle3
    target_config: /srv/models/Kimi-K2.5/config.json
    vllm_version: "{{ vllm_installed_version }}"
    served_max_model_len: "{{ vllm_max_model_len }}"
    pipeline_parallel_size: "{{ vllm_pipeline_parallel_size }}"

- name: Report problems without failing, and pin the files by hash
  eagle3_checkpoint:
    path: /srv/models/kimi-k2.5-eagle3
    checksum: true
    fail_on_problems: false
  register: drafter_check

- name: Show what would cost acceptance
  ansible.builtin.debug:
    msg: "{{ ansible_facts.eagle3_checkpoint.warnings }}"
  when: ansible_facts.eagle3_checkpoint.warnings | length > 0
"""

RETURN = r"""
normalized:
  description: Whether I(normalize) wrote C(config.json) (in check mode, would write it).
  returned: always
  type: bool
ansible_facts:
  description: Facts added to C(ansible_facts).
  returned: always
  type: complex
  contains:
    eagle3_checkpoint:
      description: What the drafter directory holds, and whether vLLM can use it as an EAGLE-3 drafter.
      returned: always
      type: complex
      contains:
        path:
          description: The drafter directory that was checked.
          type: str
          sample: /srv/models/kimi-k2.5-eagle3
        valid:
          description: True when there are no problems (warnings do not count).
          type: bool
          sample: true
        problems:
          description: Why vLLM would refuse or mis-load the drafter; one line each.
          type: list
          elements: str
          sample: ["lm_head.weight is [32000, 4096], expected [32000, 7168] (draft_vocab_size, hidden_size)"]
        warnings:
          description: What would quietly lower acceptance, each with the reason and the fix; one line each.
          type: list
          elements: str
          sample: []
        format:
          description: C(flat) or C(speculators); null when C(config.json) cannot be read.
          type: str
          sample: flat
        architecture:
          description: C(architectures[0]) of the drafter config; null when absent.
          type: str
          sample: LlamaForCausalLMEagle3
        model_type:
          description: The drafter's C(model_type) (C(transformer_layer_config.model_type) for speculators).
          type: str
          sample: llama
        hidden_size:
          description: The drafter's hidden size.
          type: int
          sample: 7168
        vocab_size:
          description: The (target) vocabulary size the drafter was built for.
          type: int
          sample: 163840
        draft_vocab_size:
          description: The drafter's own vocabulary (rows of C(lm_head.weight)); C(vocab_size) when unset.
          type: int
          sample: 32000
        target_hidden_size:
          description: Hidden size of the target's aux hidden states; C(hidden_size) when unset.
          type: int
          sample: 7168
        aux_layer_ids:
          description: C(eagle_aux_hidden_state_layer_ids) as the config declares them; null when absent.
          type: list
          elements: int
          sample: [2, 30, 58]
        aux_layer_ids_source:
          description: Where the ids were found - C(top-level), C(eagle_config), or null when absent.
          type: str
          sample: eagle_config
        norm_before_residual:
          description: The config's C(norm_before_residual); null when not written.
          type: bool
          sample: null
        max_position_embeddings:
          description: The drafter's context length; null when absent.
          type: int
          sample: 262144
        speculative_tokens:
          description: C(speculators_config.proposal_methods[0].speculative_tokens); null for flat configs.
          type: int
          sample: null
        layer_prefix:
          description: C(midlayer.) or C(layers.0.), the prefix of the drafter layer's tensors; null if none.
          type: str
          sample: midlayer.
        has_d2t:
          description: Whether a C(d2t) (draft-to-target id offsets) tensor is present.
          type: bool
          sample: true
        num_tensors:
          description: Tensors across all readable safetensors files.
          type: int
          sample: 14
        total_bytes:
          description: Bytes of tensor data across all readable safetensors files (headers not counted).
          type: int
          sample: 2437939200
        files:
          description:
            - C(config.json), C(model.safetensors.index.json) when present, and every safetensors file read.
            - Each entry has C(name) and C(size), and C(sha256) when I(checksum=true).
          type: list
          elements: dict
          sample: [{"name": "config.json", "size": 1017}, {"name": "model.safetensors", "size": 2437940000}]
        config:
          description:
            - The drafter's C(config.json) as read, so that a caller need not read it again; null when it
              cannot be read.
          type: dict
          sample: {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 7168}
        target:
          description:
            - The target config read (C(config)) and its C(hidden_size), C(num_hidden_layers), C(model_type).
            - Null without I(target_config).
          type: dict
          sample:
            config: /srv/models/Kimi-K2.5/config.json
            hidden_size: 7168
            num_hidden_layers: 61
            model_type: kimi_k2
        vllm_version:
          description: I(vllm_version) as compared (C(major.minor.patch)); null when not given.
          type: str
          sample: 0.33.0
"""

import json
import math
import os
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.safetensors_header import INDEX_NAME, read_checkpoint
from ansible.module_utils.vllm_version import parse_vllm_version

CONFIG_NAME = "config.json"

# Flat drafter architectures vLLM registers for EAGLE-3, and the attention their layer 0 has.
KNOWN_ARCHITECTURES = {
    "LlamaForCausalLMEagle3": "llama",
    "Eagle3LlamaForCausalLM": "llama",
    "Eagle3DeepseekV2ForCausalLM": "mla",
}
SPECULATORS_TYPE = "eagle3"
AUX_IDS_KEY = "eagle_aux_hidden_state_layer_ids"
# vLLM's EAGLE-3 default: three aux hidden states (the target's get_eagle3_default_aux_hidden_state_layers).
DEFAULT_NUM_AUX = 3
LAYER_PREFIXES = ("midlayer.", "layers.0.")  # vLLM renames midlayer. to layers.0.
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
TOP_LEVEL_TENSORS = ("fc.weight", "norm.weight", "lm_head.weight")
INTEGER_DTYPES = ("I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8")

# vLLM releases that fixed something a drafter config can trip over (docs/vllm-eagle3.md, version table).
NORM_BEFORE_FC_SINCE = (0, 19, 0)
NORM_OUTPUT_SINCE = (0, 25, 0)
AUX_ID_EQUAL_TO_LAYERS_SINCE = (0, 25, 0)
YARN_MSCALE_SINCE = (0, 30, 0)

# read_drafter_config() values that go into the fact as they are.
SUMMARY_FACTS = (
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
)


def version_text(version):
    return ".".join(str(part) for part in version) if version else None


def load_json(path, label):
    """(object, None) or (None, one-line problem starting with `label`)."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        if not os.path.exists(path):
            return None, f"{label} does not exist"
        return None, f"{label} cannot be read: {exc.strerror or exc}"
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return None, f"{label} is not valid JSON: {' '.join(str(exc).split())}"
    if not isinstance(data, dict):
        return None, f"{label} is a JSON {type(data).__name__}, not an object"
    return data, None


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(source, key, where, problems, required=True):
    value = source.get(key)
    if value is None:
        if required:
            problems.append(f"{where} has no {key}")
        return None
    if not _is_int(value) or value < 1:
        problems.append(f"{where} {key} is {value!r}, not a positive integer")
        return None
    return value


def _rope(source):
    rope = source.get("rope_scaling")
    if rope is None:
        rope = source.get("rope_parameters")
    return rope if isinstance(rope, dict) else None


def read_drafter_config(config):
    """Summarise a drafter config.json (flat or speculators). Pure; returns a dict with its own `problems`."""
    problems = []
    summary = {
        "format": None,
        "architecture": None,
        "attention": None,
        "model_type": None,
        "hidden_size": None,
        "vocab_size": None,
        "draft_vocab_size": None,
        "target_hidden_size": None,
        "aux_layer_ids": None,
        "aux_layer_ids_source": None,
        "aux_layer_ids_nested": None,
        "norm_before_residual": config.get("norm_before_residual"),
        "norm_before_fc": bool(config.get("norm_before_fc")),
        "norm_output": bool(config.get("norm_output") or config.get("fc_norm")),
        "max_position_embeddings": None,
        "rope": None,
        "speculative_tokens": None,
        "problems": problems,
    }
    architectures = config.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        summary["architecture"] = architectures[0]

    if "speculators_model_type" in config:
        summary["format"] = "speculators"
        kind = config["speculators_model_type"]
        if kind != SPECULATORS_TYPE:
            problems.append(f"speculators_model_type is {kind!r}, not {SPECULATORS_TYPE!r}")
        layer = config.get("transformer_layer_config")
        if not isinstance(layer, dict):
            problems.append("speculators config has no transformer_layer_config object")
            layer = {}
        where = "transformer_layer_config"
        summary["attention"] = "llama"
        _speculative_tokens(config, summary, problems)
    else:
        summary["format"] = "flat"
        layer = config
        where = "config.json"
        if summary["architecture"] is None:
            problems.append("config.json names no architecture (architectures) and no speculators_model_type")
        elif summary["architecture"] not in KNOWN_ARCHITECTURES:
            problems.append(
                f"unknown architecture {summary['architecture']!r}: vLLM loads EAGLE-3 drafters as "
                + ", ".join(KNOWN_ARCHITECTURES)
                + " or a speculators config with speculators_model_type eagle3"
            )
        else:
            summary["attention"] = KNOWN_ARCHITECTURES[summary["architecture"]]

    summary["model_type"] = layer.get("model_type") if isinstance(layer.get("model_type"), str) else None
    hidden = summary["hidden_size"] = _positive_int(layer, "hidden_size", where, problems)
    vocab = summary["vocab_size"] = _positive_int(layer, "vocab_size", where, problems)
    draft_vocab = _positive_int(config, "draft_vocab_size", "config.json", problems, required=False)
    summary["draft_vocab_size"] = draft_vocab or vocab
    target_hidden = _positive_int(config, "target_hidden_size", "config.json", problems, required=False)
    summary["target_hidden_size"] = target_hidden or hidden
    if draft_vocab and vocab and draft_vocab > vocab:
        problems.append(f"draft_vocab_size {draft_vocab} is larger than vocab_size {vocab}")
    summary["max_position_embeddings"] = _positive_int(
        layer, "max_position_embeddings", where, problems, required=False
    )
    summary["rope"] = _rope(layer)
    _aux_layer_ids(config, summary, problems)
    return summary


def _speculative_tokens(config, summary, problems):
    speculators = config.get("speculators_config")
    methods = speculators.get("proposal_methods") if isinstance(speculators, dict) else None
    first = methods[0] if isinstance(methods, list) and methods else None
    tokens = first.get("speculative_tokens") if isinstance(first, dict) else None
    if _is_int(tokens) and tokens > 0:
        summary["speculative_tokens"] = tokens
    else:
        problems.append(
            "speculators_config.proposal_methods[0].speculative_tokens is missing or not a positive integer:"
            " vLLM takes num_speculative_tokens from it"
        )


def _aux_layer_ids(config, summary, problems):
    nested = config.get("eagle_config")
    nested_ids = nested.get(AUX_IDS_KEY) if isinstance(nested, dict) else None
    top_ids = config.get(AUX_IDS_KEY)
    if top_ids is not None:
        ids, source = top_ids, "top-level"
    elif nested_ids is not None:
        ids, source = nested_ids, "eagle_config"
    else:
        return
    where = AUX_IDS_KEY if source == "top-level" else f"eagle_config.{AUX_IDS_KEY}"
    if not isinstance(ids, list) or not ids or not all(_is_int(i) and i >= 0 for i in ids):
        problems.append(f"{where} is {ids!r}, not a non-empty list of layer numbers")
        return
    summary["aux_layer_ids"] = list(ids)
    summary["aux_layer_ids_source"] = source
    if source == "top-level" and nested_ids is not None:
        summary["aux_layer_ids_nested"] = nested_ids


def _version_clause(version, since):
    """'' when version >= since (no warning), else the clause naming what is installed."""
    if version is None:
        return f"vLLM before {version_text(since)} (vllm_version not given)"
    if version >= since:
        return ""
    return f"vLLM {version_text(version)}, older than {version_text(since)},"


def yarn_mscale(factor):
    """The attention scaling plain YaRN applies (0.1 ln(factor) + 1), as vLLM's YaRN rotary embedding does."""
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


def drafter_warnings(summary, version=None, served_max_model_len=None, pipeline_parallel_size=1):
    """Valid-but-costly findings, each a line saying why and how to fix. Pure."""
    warnings = []
    ids, source = summary["aux_layer_ids"], summary["aux_layer_ids_source"]
    if source == "eagle_config":
        warnings.append(
            f"{AUX_IDS_KEY} {ids} is only under eagle_config, which vLLM 0.33's default runner ignores: it"
            f" captures the target's default layers instead of the ones the drafter was trained on; move"
            f" {AUX_IDS_KEY} to the top level of config.json"
        )
    elif summary["aux_layer_ids_nested"] is not None and summary["aux_layer_ids_nested"] != ids:
        warnings.append(
            f"{AUX_IDS_KEY} is {ids} at the top level but {summary['aux_layer_ids_nested']} under"
            f" eagle_config: vLLM uses the top-level ids; make both say the layers the drafter was trained on"
        )
    if summary["norm_before_residual"] is None:
        warnings.append(
            "norm_before_residual is not written: it defaults to False in flat configs but True in"
            " speculators configs, so the same weights run differently depending on the loader; write it"
            " explicitly with the value the drafter was trained with"
        )
    clause = _version_clause(version, NORM_BEFORE_FC_SINCE)
    if summary["norm_before_fc"] and clause:
        warnings.append(
            f"norm_before_fc is true, and {clause} drops it silently: the drafter runs without the norm it"
            f" was trained with; upgrade vLLM to {version_text(NORM_BEFORE_FC_SINCE)} or newer"
        )
    clause = _version_clause(version, NORM_OUTPUT_SINCE)
    if summary["norm_output"] and clause:
        warnings.append(
            f"norm_output/fc_norm (EAGLE 3.1) is set, and {clause} drops it silently: the drafter runs"
            f" without the norm it was trained with; upgrade vLLM to {version_text(NORM_OUTPUT_SINCE)} or"
            f" newer"
        )
    rope = summary["rope"] or {}
    rope_type = rope.get("rope_type", rope.get("type"))
    clause = _version_clause(version, YARN_MSCALE_SINCE)
    has_mscale = any(rope.get(key) is not None for key in ("mscale", "mscale_all_dim"))
    if summary["attention"] == "llama" and rope_type == "yarn" and has_mscale and clause:
        factor = rope.get("factor")
        scale = (
            yarn_mscale(factor) if isinstance(factor, (int, float)) and not isinstance(factor, bool) else None
        )
        size = (
            f"~{scale:.2f}x, attention logits ~{scale * scale:.1f}x" if scale else "up, attention logits up"
        )
        warnings.append(
            f"Llama drafter with yarn RoPE carrying mscale/mscale_all_dim: {clause} ignores them"
            f" (issue #48621), so cos/sin are scaled {size}; upgrade vLLM to"
            f" {version_text(YARN_MSCALE_SINCE)} or newer (PR #56446) or drop mscale/mscale_all_dim from the"
            f" drafter's rope_scaling"
        )
    context = summary["max_position_embeddings"]
    if served_max_model_len and context and context < served_max_model_len:
        warnings.append(
            f"drafter max_position_embeddings {context} is below the served max_model_len"
            f" {served_max_model_len}: vLLM lowers the target's max_model_len to the drafter's; raise"
            f" max_position_embeddings in the drafter's config.json or serve a shorter max_model_len"
        )
    if pipeline_parallel_size and pipeline_parallel_size > 1:
        warnings.append(
            f"pipeline_parallel_size is {pipeline_parallel_size}: vLLM refuses EAGLE-3 with pipeline"
            f" parallelism on a DeepseekV3 target (DeepSeek-V3/R1, Kimi-K2.x); use tensor parallelism only"
        )
    return warnings


def read_target_config(target):
    """{hidden_size, num_hidden_layers, model_type} of a target config (text_config for multimodal ones)."""
    text = target.get("text_config")
    if isinstance(text, dict) and ("hidden_size" not in target or "num_hidden_layers" not in target):
        source = text
    else:
        source = target
    return {
        "hidden_size": source.get("hidden_size"),
        "num_hidden_layers": source.get("num_hidden_layers"),
        "model_type": source.get("model_type", target.get("model_type")),
    }


def target_problems(summary, target, path, version=None):
    """Problems pairing the drafter with a target (read_target_config()). Pure."""
    problems = []
    hidden, layers = target["hidden_size"], target["num_hidden_layers"]
    if not (_is_int(hidden) and hidden > 0):
        problems.append(f"target config {path} has no usable hidden_size ({hidden!r})")
    elif summary["target_hidden_size"] and summary["target_hidden_size"] != hidden:
        problems.append(
            f"drafter target_hidden_size {summary['target_hidden_size']} (hidden_size when unset) differs"
            f" from the target's hidden_size {hidden}: fc.weight cannot take this target's hidden states"
        )
    if not (_is_int(layers) and layers > 0):
        problems.append(f"target config {path} has no usable num_hidden_layers ({layers!r})")
    elif summary["aux_layer_ids"]:
        final_ok = version is not None and version >= AUX_ID_EQUAL_TO_LAYERS_SINCE
        missing = [i for i in summary["aux_layer_ids"] if i > layers or (i == layers and not final_ok)]
        if missing:
            problems.append(
                f"aux layer id(s) {missing} not below the target's num_hidden_layers {layers}: vLLM captures"
                f" nothing for them (vLLM issue #46788)"
            )
    return problems


def _shape(tensors, name):
    info = tensors.get(name)
    return info["shape"] if info else None


def tensor_problems(summary, tensors):
    """(layer_prefix, problems) for the tensor names and shapes of a drafter. Pure."""
    problems = []
    if not tensors:
        return None, problems
    present = [prefix for prefix in LAYER_PREFIXES if any(name.startswith(prefix) for name in tensors)]
    if len(present) > 1:
        problems.append(
            "tensors under both midlayer. and layers.0.: vLLM renames midlayer. to layers.0., so they collide"
        )
    prefix = present[0] if present else None

    missing = []
    if prefix is None:
        missing.append("midlayer.* or layers.0.* (the drafter layer)")
    else:
        if summary["attention"] == "llama":
            missing += [
                f"{prefix}self_attn.{proj}.weight"
                for proj in ATTENTION_PROJECTIONS
                if f"{prefix}self_attn.{proj}.weight" not in tensors
            ]
        elif not any(name.startswith(prefix + "self_attn.") for name in tensors):
            missing.append(f"{prefix}self_attn.*")
        missing += [
            f"{prefix}mlp.{proj}.weight"
            for proj in MLP_PROJECTIONS
            if f"{prefix}mlp.{proj}.weight" not in tensors
        ]
    missing += [name for name in TOP_LEVEL_TENSORS if name not in tensors]
    if missing:
        problems.append("missing tensor(s): " + ", ".join(missing))

    hidden, target_hidden = summary["hidden_size"], summary["target_hidden_size"]
    vocab, draft_vocab = summary["vocab_size"], summary["draft_vocab_size"]
    n_aux = len(summary["aux_layer_ids"]) if summary["aux_layer_ids"] else DEFAULT_NUM_AUX

    shape = _shape(tensors, "fc.weight")
    if shape is not None and hidden and target_hidden and shape != [hidden, n_aux * target_hidden]:
        problems.append(
            f"fc.weight is {shape}, expected [{hidden}, {n_aux * target_hidden}]"
            f" (hidden_size, {n_aux} aux layers x target_hidden_size {target_hidden})"
        )
    if prefix is not None and summary["attention"] == "llama" and hidden:
        for proj in ATTENTION_PROJECTIONS[:3]:
            name = f"{prefix}self_attn.{proj}.weight"
            shape = _shape(tensors, name)
            if shape is not None and (len(shape) != 2 or shape[1] != 2 * hidden):
                problems.append(
                    f"{name} is {shape}: layer 0 takes [embeddings, hidden state], expected {2 * hidden}"
                    f" inputs (2 x hidden_size)"
                )
    shape = _shape(tensors, "lm_head.weight")
    if shape is not None and hidden and draft_vocab and shape != [draft_vocab, hidden]:
        problems.append(
            f"lm_head.weight is {shape}, expected [{draft_vocab}, {hidden}] (draft_vocab_size, hidden_size)"
        )
    shape = _shape(tensors, "norm.weight")
    if shape is not None and hidden and shape != [hidden]:
        problems.append(f"norm.weight is {shape}, expected [{hidden}]")

    d2t = tensors.get("d2t")
    if d2t is None:
        if draft_vocab and vocab and draft_vocab < vocab:
            problems.append(
                f"draft_vocab_size {draft_vocab} < vocab_size {vocab} but there is no d2t tensor:"
                f" vLLM cannot map draft token ids to target ids"
            )
    else:
        if draft_vocab and d2t["shape"] != [draft_vocab]:
            problems.append(f"d2t is {d2t['shape']}, expected [{draft_vocab}] (draft_vocab_size)")
        if d2t["dtype"] not in INTEGER_DTYPES:
            problems.append(f"d2t is {d2t['dtype']}, expected an integer dtype (I64 offsets)")
    return prefix, problems


def _file_entry(directory, name, sha256):
    path = os.path.join(directory, name)
    entry = {"name": name, "size": os.path.getsize(path)}
    if sha256:
        entry["sha256"] = sha256(path)
    return entry


def inspect_drafter(
    path,
    target_config=None,
    version=None,
    served_max_model_len=None,
    pipeline_parallel_size=1,
    sha256=None,
):
    """The eagle3_checkpoint fact for a drafter directory; reads configs and headers.

    `sha256`, when given, is a function path -> hex digest (main passes module.sha256 when checksum=true):
    every file read then gets its "sha256" in "files".
    """
    facts = {
        "path": path,
        "valid": False,
        "problems": [],
        "warnings": [],
        **dict.fromkeys(SUMMARY_FACTS),
        "layer_prefix": None,
        "has_d2t": False,
        "num_tensors": 0,
        "total_bytes": 0,
        "files": [],
        "config": None,
        "target": None,
        "vllm_version": version_text(version),
    }
    problems = facts["problems"]
    if not os.path.isdir(path):
        problems.append("no such directory" if not os.path.exists(path) else "not a directory")
        return facts

    config, problem = load_json(os.path.join(path, CONFIG_NAME), CONFIG_NAME)
    summary = None
    if problem:
        problems.append(problem)
    else:
        facts["files"].append(_file_entry(path, CONFIG_NAME, sha256))
        facts["config"] = config
        summary = read_drafter_config(config)
        problems.extend(summary["problems"])
        for key in SUMMARY_FACTS:
            facts[key] = summary[key]

    checkpoint = read_checkpoint(path)
    if checkpoint["index"] and os.path.isfile(os.path.join(path, INDEX_NAME)):
        facts["files"].append(_file_entry(path, INDEX_NAME, sha256))
    for entry in checkpoint["files"]:
        facts["files"].append(_file_entry(path, entry["name"], sha256))
    for error in checkpoint["errors"]:
        problems.append(f"{os.path.relpath(error.path, path)}: {error.reason}")
    tensors = checkpoint["tensors"]
    facts["num_tensors"] = len(tensors)
    facts["total_bytes"] = sum(info["nbytes"] for info in tensors.values())
    facts["has_d2t"] = "d2t" in tensors
    if not checkpoint["files"] and not checkpoint["errors"]:
        if any(name.endswith(".bin") or name.endswith(".pt") for name in os.listdir(path)):
            problems.append(
                "no safetensors weights, only pickled ones (*.bin/*.pt), which this check cannot read without"
                " torch: convert them to safetensors"
            )
        else:
            problems.append("no weights: no *.safetensors file and no model.safetensors.index.json")
    elif summary is not None and not checkpoint["errors"]:
        if not tensors:
            problems.append("no weights: the safetensors files hold no tensors")
        else:
            facts["layer_prefix"], found = tensor_problems(summary, tensors)
            problems.extend(found)

    if target_config:
        target, problem = load_json(target_config, f"target config {target_config}")
        if problem:
            problems.append(problem)
        else:
            facts["target"] = dict(read_target_config(target), config=target_config)
            if summary is not None:
                problems.extend(target_problems(summary, facts["target"], target_config, version))

    if summary is not None:
        facts["warnings"] = drafter_warnings(summary, version, served_max_model_len, pipeline_parallel_size)
    facts["valid"] = not problems
    return facts


def failure_message(path, problems):
    return f"{path}: not a usable EAGLE-3 drafter: " + "; ".join(" ".join(p.split()) for p in problems)


def explicit_config(facts):
    """config.json as vLLM should read it: the aux layer ids at the top level, norm_before_residual said."""
    config = dict(facts["config"])
    if facts["aux_layer_ids"]:
        config[AUX_IDS_KEY] = facts["aux_layer_ids"]
    config.setdefault("norm_before_residual", False)
    return config


def normalize(module, path, facts):
    """Write the explicit config.json where it differs, the original kept as config.orig.json; True if it
    differs (in check mode nothing is written)."""
    explicit = explicit_config(facts)
    if explicit == facts["config"]:
        return False
    if module.check_mode:
        return True
    config, original = os.path.join(path, "config.json"), os.path.join(path, "config.orig.json")
    staged = os.path.join(module.tmpdir, "config.json")
    if not os.path.exists(original):
        shutil.copyfile(config, staged)
        os.chmod(staged, 0o644)
        module.atomic_move(staged, original)
    # As Ansible's to_nice_json writes JSON, with the newline a text file ends with.
    text = json.dumps(explicit, indent=4, sort_keys=True, separators=(",", ": "), ensure_ascii=False)
    with open(staged, "w", encoding="utf-8") as handle:
        handle.write(text + "\n")
    os.chmod(staged, 0o644)
    module.atomic_move(staged, config)
    return True


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            target_config=dict(type="path"),
            vllm_version=dict(type="str"),
            served_max_model_len=dict(type="int"),
            pipeline_parallel_size=dict(type="int", default=1),
            checksum=dict(type="bool", default=False),
            normalize=dict(type="bool", default=False),
            fail_on_problems=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    version = None
    if params["vllm_version"]:
        try:
            version = parse_vllm_version(params["vllm_version"])
        except ValueError as exc:
            module.fail_json(msg=f"vllm_version {exc}")
    if params["pipeline_parallel_size"] < 1:
        module.fail_json(
            msg=f"pipeline_parallel_size is {params['pipeline_parallel_size']}, must be 1 or more"
        )
    if params["served_max_model_len"] is not None and params["served_max_model_len"] < 1:
        module.fail_json(msg=f"served_max_model_len is {params['served_max_model_len']}, must be 1 or more")

    facts = inspect_drafter(
        params["path"],
        target_config=params["target_config"],
        version=version,
        served_max_model_len=params["served_max_model_len"],
        pipeline_parallel_size=params["pipeline_parallel_size"],
        sha256=module.sha256 if params["checksum"] else None,
    )
    result = {"changed": False, "normalized": False, "ansible_facts": {"eagle3_checkpoint": facts}}
    if facts["problems"]:
        if params["fail_on_problems"]:
            module.fail_json(msg=failure_message(params["path"], facts["problems"]), **result)
    elif params["normalize"]:
        try:
            result["normalized"] = result["changed"] = normalize(module, params["path"], facts)
        except OSError as error:
            module.fail_json(msg=f"cannot write {params['path']}/config.json: {error}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
