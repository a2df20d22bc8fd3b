"""A small GPT decoder: pre-norm blocks, causal SDPA attention, 4x MLP, tied embeddings.

Linear layers have no biases and LayerNorms only a gain, so the parameter count has a
closed form (`critbatch.science.model_size.param_count`). Init: N(0, init_std) for weights
and embeddings, with the residual output projections scaled by 1/sqrt(2 * depth)
(GPT-2) so the residual stream's variance does not grow with depth.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from critbatch.training.config import ModelConfig


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, 4 * width, bias=False)
        self.proj = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width, bias=False)
        self.attn = Attention(width, heads)
        self.ln2 = nn.LayerNorm(width, bias=False)
        self.mlp = MLP(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(vocab_size, cfg.width)  # also the output layer (tied)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg.width, cfg.heads) for _ in range(cfg.depth))
        self.ln_f = nn.LayerNorm(cfg.width, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if p.ndim < 2:
                nn.init.ones_(p)
            elif name.endswith("proj.weight"):  # outputs added to the residual stream
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.cfg.depth))
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V), or the mean cross-entropy in nats/token when targets are given."""
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.T  # (B, T, V)
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(B * T, -1), targets.reshape(B * T))

    def hidden_matrices(self) -> list[nn.Parameter]:
        """The 2D weights inside the blocks (attention and MLP): what Muon optimises."""
        return [p for p in self.blocks.parameters() if p.ndim == 2]
