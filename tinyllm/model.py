"""A small decoder-only transformer (nanoGPT shape).

Causal self-attention through ``F.scaled_dot_product_attention``, pre-norm blocks, GELU MLP,
tied token embedding / output head. Configured by ``tinyllm.spec.ModelConfig``.
Shapes: B batch, T time (tokens), C channels (n_embd), H heads, V vocab.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .digest import state_digest  # noqa: F401  (re-exported: tinyllm.model.state_digest)
from .spec import ModelConfig


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no ``bias=False`` before 2.1 everywhere)."""

    def __init__(self, ndim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _LayerNorm.apply(x, self.weight, self.bias)


# PyTorch's CPU reductions split a reduction to ONE value over >= 32768 elements into per-thread
# partial sums (at::internal::GRAIN_SIZE), so its bits depend on the thread count; a reduction to many
# values is split by output, each output summed by one thread in a fixed order. Every reduction of
# the model and the objectives is of the second kind (or below the size), which makes training
# bitwise the same for any ``torch.set_num_threads`` (tests/tinyllm/test_threads.py).
SERIAL_SUM_MAX = 4096  # a full sum of at most this many elements never splits (well under 32768)
ROW = 1024  # larger sums are taken per row of this many elements first


def invariant_sum(v: torch.Tensor) -> torch.Tensor:
    """The sum of all of ``v``'s elements, the same bits for any thread count: rows of ``ROW`` elements
    (zero-padded: adding +0.0 changes no sum) summed first, then those sums, until few enough."""
    v = v.reshape(-1)
    while v.numel() > SERIAL_SUM_MAX:
        pad = (-v.numel()) % ROW
        if pad:
            v = F.pad(v, (0, pad))
        v = v.view(-1, ROW).sum(1)
    return v.sum()


def invariant_mean(v: torch.Tensor) -> torch.Tensor:
    return invariant_sum(v) / v.numel()


class _LayerNorm(torch.autograd.Function):
    """``F.layer_norm`` with native forward and input gradient, but its weight/bias gradients as a sum
    over rows per channel (split across threads by channel): the native CPU backward sums them in
    per-thread partial buffers, the one thread-dependent gradient of this GPT."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        C = x.shape[-1]
        out, mean, rstd = torch.ops.aten.native_layer_norm(x, [C], weight, bias, 1e-5)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        C = x.shape[-1]
        dx, _, _ = torch.ops.aten.native_layer_norm_backward(dy, x, [C], mean, rstd, weight, bias, [True, False, False])
        # dy * ((x - mean) * rstd), each product rounded as written, in place in one temporary
        # (bitwise the same as out of place: a product does not depend on its operands' order)
        dw = torch.sub(x, mean).mul_(rstd).mul_(dy).reshape(-1, C).sum(0)  # (C,): each channel's rows by one thread
        db = dy.reshape(-1, C).sum(0) if ctx.has_bias else None
        return dx, dw, db


class _Softmax(torch.autograd.Function):
    """``torch.softmax`` over the last dim with its backward ``(g - sum(g * y)) * y`` as written: the
    native CPU backward of a short last dim gives other bits for 1 thread than for 2 (seen on an AVX2
    AMD EPYC with torch 2.13), which made dropout runs depend on the thread count."""

    @staticmethod
    def forward(ctx, a):
        y = torch.softmax(a, -1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return (g - (g * y).sum(-1, keepdim=True)) * y  # the sum: each row by one thread


def _dropout_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float) -> torch.Tensor:
    """Causal attention with dropout: the forward bits of SDPA's math path (what it runs on CPU when
    dropout > 0: q and k each scaled by the square root of the scale, an additive -inf mask, softmax,
    dropout, matmul), with a thread-invariant softmax backward (``_Softmax``)."""
    T = q.size(-2)
    sf = math.sqrt(1.0 / math.sqrt(q.size(-1)))
    mask = torch.zeros(T, T, dtype=q.dtype).masked_fill_(
        torch.ones(T, T, dtype=torch.bool).tril_().logical_not_(), float("-inf")
    )  # (T, T)
    att = _Softmax.apply((q * sf) @ (k.transpose(-2, -1) * sf) + mask)  # (B, H, T, T)
    return F.dropout(att, p, True) @ v  # (B, H, T, C/H)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        # n_embd is a multiple of n_head: ModelConfig checks it (tinyllm/spec.py), the one place that does
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # q, k, v at once
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, H, T, C/H)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.training and self.dropout > 0:
            y = _dropout_attention(q, k, v, self.dropout)  # (B, H, T, C/H)
        else:  # the fused CPU kernel: thread-invariant
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, C/H)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))  # (B, T, C)


class Block(nn.Module):
    """Pre-norm residual block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = LayerNorm(cfg.n_embd, cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = LayerNorm(cfg.n_embd, cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.vocab_size is None:  # no corpus named the vocabulary: byte-level (the trainer fills it in)
            cfg = cfg.model_copy(update={"vocab_size": 256})
        self.cfg = cfg
        assert cfg.vocab_size is not None  # (filled in above)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)  # token embedding (V, C)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)  # position embedding (T, C)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = LayerNorm(cfg.n_embd, cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied embeddings
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: scaled init of residual projections
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # tied weights counted once

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """idx (B, T) int64 -> logits (B, T, V); with targets (B, T) also the mean cross-entropy."""
        B, T = idx.shape
        assert T <= self.cfg.block_size, f"sequence of {T} exceeds block_size {self.cfg.block_size}"
        pos = torch.arange(T, dtype=torch.long, device=idx.device)  # (T,)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits, None
        # the mean over B*T tokens as invariant_mean (a plain mean splits across threads from 32768 tokens)
        per_token = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="none")
        return logits, invariant_mean(per_token)
