"""Small built-in models with fixed-seed random weights, for the demo, tests and benches."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, d_in: int = 13, d_hidden: int = 29, d_out: int = 7):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_in, d_hidden), nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Attention(nn.Module):
    """Causal self-attention; kv_heads < heads is grouped-query attention."""

    def __init__(self, dim: int, heads: int, kv_heads: int | None = None):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.kv_heads = kv_heads or heads
        kv_dim = self.kv_heads * self.head_dim
        self.wq, self.wo = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.wk, self.wv = nn.Linear(dim, kv_dim, bias=False), nn.Linear(dim, kv_dim, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q = self.wq(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = (w(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
                for w in (self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.kv_heads != self.heads)
        return self.wo(y.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate, self.up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class TransformerBlock(nn.Module):
    """Pre-norm block: rms_norm -> causal SDPA attention -> rms_norm -> SwiGLU MLP."""

    def __init__(self, dim: int = 64, heads: int = 4, hidden: int = 176,
                 kv_heads: int | None = None):
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(dim, eps=1e-5), nn.RMSNorm(dim, eps=1e-5)
        self.attn, self.mlp = Attention(dim, heads, kv_heads), SwiGLU(dim, hidden)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    """Token ids [B, T] -> logits [B, T, vocab]: embedding, blocks, final norm, LM head."""

    def __init__(self, vocab: int = 257, dim: int = 64, heads: int = 4, layers: int = 2,
                 hidden: int = 176):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads, hidden) for _ in range(layers))
        self.norm = nn.RMSNorm(dim, eps=1e-5)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


def seeded(module: nn.Module, seed: int = 0) -> nn.Module:
    """Re-initialise every parameter from a fixed seed (norm weights too, so they matter)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.dim() == 1 else p.shape[-1] ** -0.5))
            if p.dim() == 1:
                p.add_(1.0)
    return module.eval()
