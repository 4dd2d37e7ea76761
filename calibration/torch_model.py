"""The model in PyTorch with random weights: its operators, and whole forward passes built from them.

`calibration.measure` times both, so the operator tables and the validation passes measure the same
kernels. Attention is PyTorch's scaled_dot_product_attention over a contiguous KV cache, not vLLM's
paged kernels, and elementwise kernels are unfused PyTorch ops: a profile measures this PyTorch stack.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simulator.deploy.model import ModelSpec


class Layers:
    """The model's operators in PyTorch, with random weights, shared by the per-operator timings and
    the whole forward passes so both measure the same kernels."""

    def __init__(self, torch: Any, model: ModelSpec, device: str) -> None:
        self.torch, self.model, self.device = torch, model, device
        self.dtype = getattr(torch, model.dtype)
        self.f = torch.nn.functional

    def randn(self, *shape: int) -> Any:
        return self.torch.randn(*shape, device=self.device, dtype=self.dtype) * 0.02

    def rotary_tables(self, positions: Any) -> tuple[Any, Any]:
        half = self.model.head_dim // 2
        inv = 1.0 / (500000.0 ** (self.torch.arange(half, device=self.device, dtype=self.torch.float32) / half))
        angles = positions.to(self.torch.float32)[:, None] * inv[None, :]
        return angles.cos().to(self.dtype), angles.sin().to(self.dtype)

    def add_rmsnorm(self, x: Any, residual: Any, weight: Any) -> tuple[Any, Any]:
        residual = x + residual
        return self.f.rms_norm(residual, (self.model.hidden_size,), weight, 1e-5), residual

    def rotary(self, x: Any, cos: Any, sin: Any) -> Any:
        """Rotate-half rotary embedding of x: [tokens, heads, head_dim]."""
        half = self.model.head_dim // 2
        x1, x2 = x[..., :half], x[..., half:]
        c, s = cos[:, None, :], sin[:, None, :]
        return self.torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    def silu_mul(self, gate_up: Any) -> Any:
        size = gate_up.shape[-1] // 2
        return self.f.silu(gate_up[..., :size]) * gate_up[..., size:]

    def attention(self, q: Any, k: Any, v: Any, causal: bool) -> Any:
        """q: [batch, heads, queries, head_dim]; k, v: [batch, kv heads, keys, head_dim]."""
        return self.f.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def elementwise_kernels(layers: Layers, tokens: int) -> dict[str, Callable[[], object]]:
    """Each elementwise op of `simulator.cost.elementwise_ops` on `tokens` tokens (sampling: sequences)."""
    torch, model, t = layers.torch, layers.model, tokens
    h, d = model.hidden_size, model.head_dim
    norm_weight, table = layers.randn(h), layers.randn(model.vocab_size, h)
    x, residual = layers.randn(t, h), layers.randn(t, h)
    q, k = layers.randn(t, model.num_heads, d), layers.randn(t, model.num_kv_heads, d)
    cos, sin = layers.rotary_tables(torch.arange(t, device=layers.device))
    gate_up = layers.randn(t, 2 * model.intermediate_size)
    cache, kv = layers.randn(2, t, model.num_kv_heads, d), layers.randn(2, t, model.num_kv_heads, d)
    slots = torch.arange(t, device=layers.device)
    ids = torch.randint(0, model.vocab_size, (t,), device=layers.device)
    logits = layers.randn(t, model.vocab_size)
    return {
        "add_rmsnorm": lambda: layers.add_rmsnorm(x, residual, norm_weight),
        "rotary": lambda: (layers.rotary(q, cos, sin), layers.rotary(k, cos, sin)),
        "silu_mul": lambda: layers.silu_mul(gate_up),
        "kv_write": lambda: cache.index_copy_(1, slots, kv),
        "embedding": lambda: layers.f.embedding(ids, table),
        "sampling": lambda: logits.float().argmax(-1),
    }


class Forward:
    """Whole forward passes of the model with random weights: the validation set."""

    def __init__(self, layers: Layers) -> None:
        model = layers.model
        self.layers, self.model = layers, model
        self.weights = [{name: layers.randn(n, k) for name, n, k in model.linear_shapes}
                        | {"norm1": layers.randn(model.hidden_size), "norm2": layers.randn(model.hidden_size)}
                        for _ in range(model.num_layers)]
        self.embedding = layers.randn(model.vocab_size, model.hidden_size)
        self.lm_head = layers.randn(model.vocab_size, model.hidden_size)
        self.final_norm = layers.randn(model.hidden_size)

    def step(self, batch: int, new_tokens: int, context: int) -> Callable[[], object]:
        """A pass computing `new_tokens` for each of `batch` sequences whose context (after them) is `context`."""
        lay, model, torch = self.layers, self.model, self.layers.torch
        device = lay.device
        tokens, past = batch * new_tokens, context - new_tokens
        hq, hkv, d = model.num_heads, model.num_kv_heads, model.head_dim
        ids = torch.randint(0, model.vocab_size, (tokens,), device=device)
        cos, sin = lay.rotary_tables(torch.arange(past, context, device=device).repeat(batch))
        caches = [(lay.randn(batch, hkv, context, d), lay.randn(batch, hkv, context, d))
                  for _ in range(model.num_layers)]
        last = torch.arange(new_tokens - 1, tokens, new_tokens, device=device)
        q_size, kv_size = hq * d, hkv * d

        def run() -> object:
            x = lay.f.embedding(ids, self.embedding)
            residual = torch.zeros_like(x)
            for w, (k_cache, v_cache) in zip(self.weights, caches, strict=True):
                h, residual = lay.add_rmsnorm(x, residual, w["norm1"])
                qkv = lay.f.linear(h, w["qkv"])
                q = lay.rotary(qkv[:, :q_size].view(tokens, hq, d), cos, sin)
                k = lay.rotary(qkv[:, q_size:q_size + kv_size].view(tokens, hkv, d), cos, sin)
                v = qkv[:, q_size + kv_size:].view(tokens, hkv, d)
                k_cache[:, :, past:] = k.view(batch, new_tokens, hkv, d).transpose(1, 2)
                v_cache[:, :, past:] = v.view(batch, new_tokens, hkv, d).transpose(1, 2)
                q = q.view(batch, new_tokens, hq, d).transpose(1, 2).contiguous()
                out = lay.attention(q, k_cache, v_cache, causal=new_tokens > 1)
                x = lay.f.linear(out.transpose(1, 2).reshape(tokens, q_size), w["attn_out"])
                h, residual = lay.add_rmsnorm(x, residual, w["norm2"])
                x = lay.f.linear(lay.silu_mul(lay.f.linear(h, w["gate_up"])), w["down"])
            h, _ = lay.add_rmsnorm(x, residual, self.final_norm)
            return lay.f.linear(h[last], self.lm_head).float().argmax(-1)

        return run
