"""Building blocks of the DFlash drafter: RMSNorm, RoPE, the context-prepending attention, the SwiGLU MLP,
the decoder layer and the ReTrace conditioner.

Part of the Hub payload: imports only torch, transformers and sibling modules.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from .configuration_dflash import DFlashConfig
from .generation_dflash import ReTraceMemory
from .kv_dflash import TargetKVAttention

class DFlashRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class DFlashRotaryEmbedding(nn.Module):
    """Default RoPE at absolute positions, shared by context keys and block queries/keys.

    The inverse frequencies are recomputed per call (head_dim/2 values) rather than kept in a buffer:
    a non-persistent buffer would be left uninitialised when transformers builds the model on the
    meta device and loads a checkpoint.
    """

    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.head_dim = config.head_dim
        self.rope_theta = config.rope_theta

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple:
        exponent = torch.arange(0, self.head_dim, 2, device=x.device, dtype=torch.float32) / self.head_dim
        inv_freq = 1.0 / (self.rope_theta**exponent)  # (dim/2,)
        freqs = position_ids[..., None].float() * inv_freq  # (b, n, dim/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (b, n, dim)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def eager_attention(query, key, value, mask, scaling, num_key_value_groups, dropout=0.0):
    """query (b, h, q, d); key/value (b, kvh, k, d); mask bool (b, 1, q, k), True = visible."""
    key = key.repeat_interleave(num_key_value_groups, dim=1)
    value = value.repeat_interleave(num_key_value_groups, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # (b, h, q, k)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = F.dropout(probs, p=dropout)
    return torch.matmul(probs, value).transpose(1, 2)  # (b, q, h, d)


def sdpa_attention(query, key, value, mask, scaling, num_key_value_groups, dropout=0.0):
    if num_key_value_groups > 1:
        key = key.repeat_interleave(num_key_value_groups, dim=1)
        value = value.repeat_interleave(num_key_value_groups, dim=1)
    if query.is_cuda:
        # cuDNN attention builds a new plan whenever the key length changes (every round here): measured on an
        # H200 at Qwen3-8B shapes, 48 ms vs 6 ms per drafter forward. Use the other kernels.
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    else:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    return out.transpose(1, 2)  # (b, q, h, d)


ATTENTION_FUNCTIONS = {"eager": eager_attention, "sdpa": sdpa_attention}


class DFlashAttention(nn.Module):
    def __init__(self, config: DFlashConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = False
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = DFlashRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = DFlashRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        # KVShot hybrid: a second attention over the target's K/V, zero-initialised output (see kv_dflash).
        self.kv = TargetKVAttention(config) if config.context == "hybrid" else None

    def forward(self, hidden_states, context, position_embeddings, attention_mask=None, cache=None, target_kv=None):
        bsz, q_len, _ = hidden_states.shape
        kv_only = self.config.context == "kv"  # keys: the target's cached K/V, then the block's (no drafter context)
        # (b, c + q, H): context first, then the block
        kv_input = hidden_states if kv_only else torch.cat([context, hidden_states], dim=1)
        query = self.q_norm(self.q_proj(hidden_states).view(bsz, q_len, -1, self.head_dim)).transpose(1, 2)
        key = self.k_norm(self.k_proj(kv_input).view(bsz, kv_input.shape[1], -1, self.head_dim)).transpose(1, 2)
        value = self.v_proj(kv_input).view(bsz, kv_input.shape[1], -1, self.head_dim).transpose(1, 2)

        cos, sin = position_embeddings  # (b, c + q, d)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        query = query * cos[..., -q_len:, :] + rotate_half(query) * sin[..., -q_len:, :]
        key = key * cos[..., -key.shape[2]:, :] + rotate_half(key) * sin[..., -key.shape[2]:, :]
        if kv_only:  # target keys are rotated (and k-normed) by the target already
            key = torch.cat([target_kv[0].to(key.dtype), key], dim=2)
            value = torch.cat([target_kv[1].to(value.dtype), value], dim=2)
        elif cache is not None:
            key, value = cache.update(key, value, self.layer_idx)

        impl = self.config._attn_implementation or "sdpa"
        dropout = self.config.attention_dropout if self.training else 0.0
        if hasattr(attention_mask, "attend"):  # a structured mask that computes attention itself (training)
            out = attention_mask.attend(query, key, value, self.scaling, self.num_key_value_groups, dropout)
        elif impl in ATTENTION_FUNCTIONS:
            out = ATTENTION_FUNCTIONS[impl](query, key, value, attention_mask, self.scaling, self.num_key_value_groups, dropout)
        else:  # flash / flex / kernels registered with transformers
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

            out, _ = ALL_ATTENTION_FUNCTIONS[impl](
                self, query, key, value, attention_mask, dropout=dropout, scaling=self.scaling, is_causal=False
            )
        out = self.o_proj(out.reshape(bsz, q_len, -1))
        return out if self.kv is None else out + self.kv(query, target_kv, attention_mask)


class DFlashMLP(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config: DFlashConfig, layer_idx: int):
        super().__init__()
        self.self_attn = DFlashAttention(config, layer_idx)
        self.mlp = DFlashMLP(config)
        self.input_layernorm = DFlashRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = DFlashRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, context, position_embeddings, attention_mask=None, cache=None, target_kv=None):
        # The context enters every layer as is (already fc + hidden_norm), unnormed by input_layernorm.
        residual = hidden_states
        hidden_states = self.self_attn(
            self.input_layernorm(hidden_states), context, position_embeddings, attention_mask, cache, target_kv
        )
        hidden_states = residual + hidden_states
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class ReTraceConditioner(nn.Module):
    r"""Fuses the previous round's rejected trajectory into the MASK embeddings of the next block.

    r_i  = m + beta * W_c [m ; u]
    g_i  = sigmoid(W_g [e_i ; r_i])
    e'_i = e_i + valid_i * (W_v r_i) * g_i          (W_v zero-initialised: starts as plain DFlash)
    """

    def __init__(self, config: DFlashConfig):
        super().__init__()
        hidden = config.hidden_size
        self.correction = nn.Linear(2 * hidden, hidden, bias=False)  # W_c
        self.gate = nn.Linear(2 * hidden, hidden)  # W_g
        self.value = nn.Linear(hidden, hidden)  # W_v
        self.value._zero_init = True  # read by _init_weights, whatever order modules are initialised in

    def forward(self, embeds: torch.Tensor, memory: ReTraceMemory, beta: float) -> torch.Tensor:
        m = memory.drafter_states.to(embeds.dtype)
        u = memory.target_states.to(embeds.dtype)
        r = m + beta * self.correction(torch.cat([m, u], dim=-1))
        g = torch.sigmoid(self.gate(torch.cat([embeds, r], dim=-1)))
        delta = self.value(r) * g * memory.valid.unsqueeze(-1).to(embeds.dtype)
        return embeds + delta


__all__ = ["DFlashAttention", "DFlashDecoderLayer", "DFlashMLP", "DFlashRMSNorm", "DFlashRotaryEmbedding", "ReTraceConditioner",
           "eager_attention", "rotate_half", "sdpa_attention"]
