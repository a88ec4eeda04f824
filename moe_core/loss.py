"""The LM head and next-token cross-entropy without the [tokens, vocab] logits.

The plain path (``Transformer.forward`` without ``chunked_loss``) materialises the logits, an fp32
copy of them and the log-softmax that cross-entropy saves for its backward: at a 32,768-word
vocabulary and 32 × 1,024 tokens per micro-batch that is 1.07e9 elements each, about 10 GiB
before the backward adds its own, the largest activation of a 0.1B model. ``linear_cross_entropy``
walks the tokens in chunks instead: per chunk it forms the chunk's logits (in the weight's dtype,
then fp32, as the plain path does), its loss, and, when a gradient is wanted, the gradients of
the hidden states and of the head's weight right away, so that no more than one chunk's logits
ever exist. The backward then only scales the stored gradients. FLOPs are the same as the plain
path's (one GEMM forward, two for the gradients); what the backward would recompute is computed
once, in the forward.

Loss: mean over targets ≠ ``ignore_index`` of logsumexp(z) − z_target (z = h·Wᵀ in fp32), the same
as ``F.cross_entropy(logits.float(), targets)``. Gradients: (softmax(z) − onehot) / n, cast to
the compute dtype, times W (hidden states) and times h summed over chunks in fp32 (weight; each
chunk's product from an fp32-output GEMM where the backend has one, CUDA, else rounded to the
compute dtype first). The plain path sums the weight gradient inside one GEMM, so results agree
to rounding, not bit for bit (``tests/moe_core/test_loss.py``).
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 26
"""Logit elements per chunk (chunk tokens = this // vocab, at least 1): 256 MiB of fp32 logits
(and as much for their softmax) at any vocabulary."""


_MM_OUT_F32: dict[str, bool] = {}
"""Per device type: whether ``torch.mm(..., out_dtype=torch.float32)`` works (CUDA in recent
torch; not on CPU)."""


def _mm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b in fp32: for bf16/fp16 operands, an fp32-output GEMM where the backend has one (no
    rounding of the product to 8 mantissa bits before it is summed over chunks), else the
    product in the operands' dtype, then fp32."""
    kind = a.device.type
    if a.dtype != torch.float32 and _MM_OUT_F32.get(kind, True):
        try:
            out = torch.mm(a, b, out_dtype=torch.float32)
            _MM_OUT_F32[kind] = True
            return out
        except (RuntimeError, TypeError, NotImplementedError):
            _MM_OUT_F32[kind] = False
    return (a @ b).float()


def _chunk_tokens(vocab: int, chunk_tokens: int | None) -> int:
    return max(1, chunk_tokens if chunk_tokens is not None else CHUNK_ELEMENTS // vocab)


def _chunk_loss(h: torch.Tensor, weight: torch.Tensor, t: torch.Tensor, ignore_index: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(fp32 logits, valid mask, summed loss) of one chunk."""
    z = (h @ weight.t()).float()
    valid = t != ignore_index
    picked = z.gather(1, torch.where(valid, t, 0)[:, None]).squeeze(1)
    loss = ((torch.logsumexp(z, dim=-1) - picked) * valid).sum()
    return z, valid, loss


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, chunk, ignore_index):  # noqa: D102
        n = (targets != ignore_index).sum().clamp_min(1)
        inv_n = 1.0 / n.to(torch.float32)
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if ctx.needs_input_grad[1] else None
        for s in range(0, h.shape[0], chunk):
            hc, tc = h[s:s + chunk], targets[s:s + chunk]
            z, valid, loss = _chunk_loss(hc, weight, tc, ignore_index)
            total += loss
            # d loss / d z = (softmax(z) - onehot) / n on valid rows, 0 on ignored ones
            g = torch.softmax(z, dim=-1)
            rows = torch.arange(len(tc), device=h.device)
            g[rows, torch.where(valid, tc, 0)] -= 1.0
            g = (g * (valid[:, None] * inv_n)).to(h.dtype)
            if grad_h is not None:
                grad_h[s:s + chunk] = g @ weight
            if grad_w is not None:
                grad_w += _mm_f32(g.t(), hc)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        return total * inv_n

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102
        grad_h, grad_w = ctx.saved_tensors
        gh = None if grad_h is None else grad_h * grad_out.to(grad_h.dtype)
        gw = None if grad_w is None else (grad_w * grad_out).to(ctx.weight_dtype)
        return gh, gw, None, None, None


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                         chunk_tokens: int | None = None, ignore_index: int = -100
                         ) -> torch.Tensor:
    """Mean next-token cross-entropy of ``h @ weight.T`` against ``targets`` (h: [N, d],
    weight: [V, d], targets: [N]) without forming the [N, V] logits; see the module's
    docstring. Without a gradient to compute (eval, ``torch.no_grad``) it only sums the loss."""
    chunk = _chunk_tokens(weight.shape[0], chunk_tokens)
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(h, weight, targets, chunk, ignore_index)
    n = (targets != ignore_index).sum().clamp_min(1)
    total = sum((_chunk_loss(h[s:s + chunk], weight, targets[s:s + chunk], ignore_index)[2]
                 for s in range(0, h.shape[0], chunk)),
                torch.zeros((), dtype=torch.float32, device=h.device))
    return total / n.to(torch.float32)


def liger_available() -> bool:
    """Whether liger-kernel and triton are installed (the ``gpu`` extra); nothing is imported."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("liger_kernel", "triton"))


def fused_linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                               ignore_index: int = -100) -> torch.Tensor:
    """The same mean cross-entropy as :func:`linear_cross_entropy`, by liger-kernel's
    FusedLinearCrossEntropy: Triton kernels that form each chunk's logits, softmax and
    gradients in place, the weight gradient accumulated in fp32 (``accum_dtype``). It runs on
    CUDA (on a CPU only under the Triton interpreter, ``TRITON_INTERPRET=1``, which the tests
    use). It reads the number of counted targets once per call (one host sync)."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    return liger_fused_linear_cross_entropy(h, weight, targets, ignore_index=ignore_index,
                                            reduction="mean", accum_dtype=torch.float32)


def head_loss(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
              fused: bool) -> torch.Tensor:
    """The LM head's loss without the [tokens, vocab] logits: Liger's fused kernel when
    ``fused`` and a gradient is wanted, else the chunked path (the CPU path, the evaluation
    path, and the reference the fused one is tested against)."""
    if fused and torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return fused_linear_cross_entropy(h, weight, targets)
    return linear_cross_entropy(h, weight, targets)
