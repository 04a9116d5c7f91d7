"""Run a tiny random DeepseekV3 through the real (patched) vLLM model code on CPU; print JSON.

Usage: <torch venv python> vllm_eagle3_forward_probe.py <site-packages dir holding the patched vllm/>

Real vLLM classes throughout: DeepseekV3ForCausalLM, DeepseekV2Model (embedding, decoder layers,
dense MLP, RMSNorms, the patched forward) built from a DeepseekV3Config. Two things are replaced
because a GPU wheel cannot run them on CPU: the attention module (its backend selection raises
"ValueError: Invalid attention backend for None" on the UnspecifiedPlatform a GPU build sees on a
CPU box, and the kernels are CUDA ones) by a linear map, and MoE layers are avoided
(first_k_dense_replace = num_hidden_layers) because the fused-MoE backend selection fails the same
way ("UnboundLocalError: cannot access local variable 'backend'"). The aux-hidden-state capture
under test lives in DeepseekV2Model.forward, which runs unmodified.
"""

import json
import os
import socket
import sys
import types

sys.path.insert(0, sys.argv[1])
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402
import vllm.model_executor.models.deepseek_v2 as deepseek  # noqa: E402
from torch import nn  # noqa: E402
from transformers import DeepseekV3Config  # noqa: E402
from vllm.config import CompilationConfig, DeviceConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.distributed import init_distributed_environment, initialize_model_parallel  # noqa: E402
from vllm.model_executor.models.interfaces import SupportsEagle3, supports_eagle3  # noqa: E402

LAYERS = 5
config = DeepseekV3Config(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=LAYERS,
    first_k_dense_replace=LAYERS,
    num_attention_heads=2,
    num_key_value_heads=2,
    q_lora_rank=None,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=8,
    n_routed_experts=4,
    n_shared_experts=1,
    num_experts_per_tok=2,
    max_position_embeddings=64,
)


class LinearAttention(nn.Module):
    """Stands in for DeepseekV2MLAAttention / DeepseekAttention (same call signature)."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, positions, hidden_states, *args, **kwargs):
        return self.proj(hidden_states)


deepseek.DeepseekV2MLAAttention = LinearAttention
deepseek.DeepseekAttention = LinearAttention


class ModelConfig:
    hf_config = hf_text_config = config
    dtype = torch.float32
    enforce_eager = True
    use_mla = True


vllm_config = VllmConfig(
    device_config=DeviceConfig(device="cpu"),
    compilation_config=CompilationConfig(custom_ops=["none"], mode=0),
)
report = {}
with socket.socket() as free:
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
with set_current_vllm_config(vllm_config):
    init_distributed_environment(
        world_size=1, rank=0, local_rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo"
    )
    initialize_model_parallel(1, 1)
    vllm_config.model_config = ModelConfig()  # after the parallel groups, which read a real one
    model = deepseek.DeepseekV3ForCausalLM(vllm_config=vllm_config, prefix="")
    torch.manual_seed(0)
    for parameter in model.parameters():
        torch.nn.init.normal_(parameter, std=0.2)

    report["classes"] = [cls.__name__ for cls in type(model).__mro__]
    report["supports_eagle3"] = bool(supports_eagle3(model)) and isinstance(model, SupportsEagle3)
    if not hasattr(model, "set_aux_hidden_state_layers"):  # an unpatched release
        print("PROBE " + json.dumps(report))
        sys.exit(0)

    # The input of each decoder layer, as hidden_states + residual, seen from outside the forward.
    seen = {}

    def record(index):
        def hook(module, args):
            positions, hidden_states, residual = args[:3]
            seen[index] = None if residual is None else (hidden_states + residual).detach().clone()

        return hook

    for index, layer in enumerate(model.model.layers):
        layer.register_forward_pre_hook(record(index))

    input_ids, positions = torch.tensor([1, 5, 9, 3, 7, 2]), torch.arange(6)
    with torch.no_grad():
        plain = model(input_ids, positions)
        model.set_aux_hidden_state_layers((1, 2))
        with_aux = model(input_ids, positions)
        model.set_aux_hidden_state_layers(())
        plain_again = model(input_ids, positions)

    report["real_mlp"] = type(model.model.layers[0].mlp).__qualname__
    report["plain_is_tensor"] = isinstance(plain, torch.Tensor)
    report["with_aux_is_pair"] = isinstance(with_aux, tuple) and len(with_aux) == 2
    hidden, aux = with_aux
    report["aux_count"] = len(aux)
    report["aux_equal_layer_inputs"] = [torch.equal(aux[0], seen[1]), torch.equal(aux[1], seen[2])]
    report["aux_differ_from_other_layers"] = not any(
        torch.equal(aux[0], seen[i]) for i in range(LAYERS) if i != 1 and seen[i] is not None
    )
    report["final_hidden_unchanged"] = torch.equal(hidden, plain)
    report["plain_again_is_tensor"] = isinstance(plain_again, torch.Tensor)
    report["default_layers"] = list(model.get_eagle3_aux_hidden_state_layers())
    report["layers_stored_on_model"] = list(model.model.aux_hidden_state_layers)
    report["vllm_file"] = deepseek.__file__

    # The Kimi-K2.5 wrapper (vision tower and all) is too heavy to build; its two methods are called
    # on a stand-in that only has the language model, which is this real DeepseekV3 model.
    from vllm.model_executor.models.kimi_k25 import KimiK25ForConditionalGeneration as Kimi

    wrapper = types.SimpleNamespace(language_model=model)
    Kimi.set_aux_hidden_state_layers(wrapper, (2, 3))
    report["kimi_supports_eagle3"] = bool(supports_eagle3(Kimi))
    report["kimi_forwards_set"] = list(model.model.aux_hidden_state_layers)
    report["kimi_forwards_get"] = list(Kimi.get_eagle3_aux_hidden_state_layers(wrapper))

print("PROBE " + json.dumps(report))
