"""The fast path of §5.4's label-smoothed loss (defined in aiayn/training/loss.py): its two sums
with a hand-written gradient, and its per-token terms, from (N, V) logits of any float dtype,
computed in float32 without ever storing a float32 (N, V) matrix.

With lse_i = log sum_k exp z_ik and A the K ids that can be a target (all but `NEVER_TARGET`):
nll_i = lse_i - z_i,y_i and uniform_i = lse_i - mean_{k in A} z_ik, the smoothed loss
(1 - eps) nll + eps uniform. On a CPU a block of rows at a time (`block_rows`), so each block's
passes mostly hit cache; on a GPU the whole tensor at once through two compiled kernels
(`_whole_terms`, `_whole_grad`), falling back to one eager block where compiling fails.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from aiayn.special import BOS_ID, PAD_ID

log = logging.getLogger(__name__)

# Ids that are never a target, so the smoothing puts no mass on them.
NEVER_TARGET = (PAD_ID, BOS_ID)


# Rows of logits handled at a time on a CPU: a (256, 8000) float32 block is 8 MB, so each block's
# passes (max, exp, sum; then exp, subtract, scale) mostly hit cache instead of memory. A GPU takes
# every row in one block: there a loop of blocks is a row of small kernel launches (50 blocks, a
# dozen kernels each, at 12,500 tokens), and memory bandwidth, not cache, is what bounds a pass.
_CHUNK_ROWS = 256


def block_rows(logits: Tensor) -> int:
    """How many rows of `logits` each pass of the loss takes at once (`_CHUNK_ROWS` on a CPU)."""
    return max(logits.size(0), 1) if logits.is_cuda else _CHUNK_ROWS


def _blocked_terms(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per row of (N, V) logits, in float32, a block of rows at a time: -log p(target)
    (N,), the mean of -log p over the ids that can be a target (N,), and the log-normaliser
    lse (N, 1)."""
    n, v = logits.shape
    never = list(NEVER_TARGET)
    nll = torch.empty(n, dtype=torch.float32, device=logits.device)
    uniform = torch.empty(n, dtype=torch.float32, device=logits.device)
    lse = torch.empty(n, 1, dtype=torch.float32, device=logits.device)
    rows = block_rows(logits)
    for a in range(0, n, rows):
        b = a + rows
        z = logits[a:b].float()  # (rows, V); a copy for low-precision logits, a view for fp32
        lp = torch.log_softmax(z, dim=-1)  # (rows, V)
        y = target[a:b].unsqueeze(1)  # (rows, 1)
        lp_y = lp.gather(1, y)  # (rows, 1)
        nll[a:b] = lp_y.squeeze(1).neg()
        # mean of -log p over the ids that can be a target
        uniform[a:b] = (lp[:, never].sum(dim=-1) - lp.sum(dim=-1)) / (v - len(never))
        lse[a:b] = z.gather(1, y) - lp_y  # log p = z - lse at every id, the reference's too
    return nll, uniform, lse


def _whole_terms(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """`_blocked_terms` for a GPU, written for the compiler: from (N, V) logits of any float dtype
    and (N,) ids, -log p(target), the mean of -log p over the ids that can be a target, and lse
    (N, 1), float32. Compiled, the float32 view of the logits is never stored: each row's max,
    sum of exponentials, sum and reference logit come from reading the logits about twice."""
    z = logits.float()  # (N, V)
    lse = torch.logsumexp(z, dim=-1, keepdim=True)  # (N, 1)
    z_ref = z.gather(1, target.unsqueeze(1))  # (N, 1)
    z_never = sum(z[:, i:i + 1] for i in NEVER_TARGET)  # (N, 1)
    mean_z = (z.sum(dim=-1, keepdim=True) - z_never) / (z.size(1) - len(NEVER_TARGET))
    return (lse - z_ref).squeeze(1), (lse - mean_z).squeeze(1), lse


def _whole_grad(logits: Tensor, target: Tensor, lse: Tensor, on_softmax: Tensor, on_ref: Tensor,
                on_all: Tensor) -> Tensor:
    """The backward's block of `SmoothedCrossEntropy`, for a GPU and the compiler: every term as
    one expression of (N, V), so the compiled form is one kernel that reads the logits once and
    writes the gradient once in their dtype (the CPU's in-place block loop scatters, which the
    compiler cannot fuse). lse, on_*: (N, 1) float32."""
    cols = torch.arange(logits.size(1), device=logits.device)  # (V,)
    never = sum(cols == i for i in NEVER_TARGET)  # (V,) 1 at PAD and BOS
    g = torch.exp(logits.float() - lse) * on_softmax - on_all * (1 - never)  # (N, V)
    g = g - torch.where(cols == target.unsqueeze(1), on_ref, 0.0)  # (N, V)
    return g.to(logits.dtype)


def _rows_dynamic(compiled):
    """`compiled` called with the first dimension (rows) of every tensor argument marked dynamic:
    one graph for every batch's row count, while the vocabulary stays a constant in the kernels
    (`torch.compile(dynamic=True)` makes it a symbol too, and each element's row and column then
    come from a division by a runtime value)."""
    def call(*args):
        # detached: the kernels compute values only (the gradient is `SmoothedCrossEntropy`'s),
        # and one requires_grad flag for every call keeps one graph
        args = [a.detach() if isinstance(a, Tensor) else a for a in args]
        for a in args:
            torch._dynamo.mark_dynamic(a, 0)
        return compiled(*args)
    return call


# The two functions above compiled (torch.compile, dynamic rows), made on first use; None until then,
# False where compiling failed (then the GPU takes the eager one-block path, `block_rows`).
_compiled: tuple | bool | None = None


def fused_on(logits: Tensor) -> bool:
    """Whether the loss takes the compiled whole-tensor path for these logits: on a GPU."""
    return logits.is_cuda


def _fused_kernels(logits: Tensor) -> tuple | None:
    """The compiled (`_whole_terms`, `_whole_grad`) for CUDA logits, None elsewhere: on a GPU
    the eager loss makes several passes over float32 copies of the (N, V) logits forward and back
    (at the paper's vocabulary, more time than every matrix product of a base step: profiled in
    docs/experiments/wmt.md); compiled, about three passes over the bf16 logits."""
    global _compiled
    if not fused_on(logits) or _compiled is False:
        return None
    if _compiled is None:
        try:
            terms = _rows_dynamic(torch.compile(_whole_terms))
            grad = _rows_dynamic(torch.compile(_whole_grad))
            # compile now, on two rows, so a failure falls back here instead of mid-backward
            z = torch.zeros(2, logits.size(1), dtype=logits.dtype, device=logits.device)
            y = torch.full((2,), 2, dtype=torch.long, device=logits.device)
            one = torch.ones(2, 1, device=logits.device)
            grad(z, y, terms(z, y)[2], one, one, one)
            _compiled = (terms, grad)
        except Exception as e:  # no Triton, no compiler: the eager path is correct, only slower
            if isinstance(e, torch.OutOfMemoryError):
                raise
            log.warning("the fused GPU loss did not compile (%s); using the eager one",
                        str(e).splitlines()[0][:200])
            _compiled = False
            return None
    return _compiled


class SmoothedCrossEntropy(torch.autograd.Function):
    """Both sums of `aiayn.training.loss.label_smoothed_loss` from (N, V) logits, the smoothed
    loss and the NLL over the rows where `keep` (N,) is True, with a hand-written gradient, a
    block of rows at a time: no (N, V) float32 log-probabilities, one-hot matrix or scattered
    gradient is ever materialised (autograd's were a large share of a CPU training step:
    docs/experiments/performance.md).
    Each block is converted to float32 once per pass; the forward keeps each row's log-normaliser
    lse_i = log sum_k exp z_ik, so the backward's softmax is one exp(z - lse) pass, with no max or
    sum pass again. With A the K ids that can be a target (all but NEVER_TARGET):
        nll_i = lse_i - z_i,y_i        uniform_i = lse_i - mean_{k in A} z_ik
        d smoothed / dz = softmax(z) - (1 - eps) onehot(y) - eps / K [k in A]  (0 on padding rows)
        d nll / dz      = softmax(z) - onehot(y)
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, keep: Tensor, eps: float):
        fused = _fused_kernels(logits)
        nll, uniform, lse = fused[0](logits, target) if fused else _blocked_terms(logits, target)
        nll = nll.masked_fill_(~keep, 0.0).sum()
        uniform = uniform.masked_fill_(~keep, 0.0).sum()
        smoothed = (1.0 - eps) * nll + eps * uniform if eps > 0 else nll
        ctx.save_for_backward(logits, target, keep, lse)
        ctx.eps = eps
        return smoothed, nll

    @staticmethod
    def backward(ctx, g_smoothed: Tensor | None, g_nll: Tensor | None):
        logits, target, keep, lse = ctx.saved_tensors
        eps, v = ctx.eps, logits.size(1)
        zero = torch.zeros((), device=logits.device)
        gs = g_smoothed.float() if g_smoothed is not None else zero
        gn = g_nll.float() if g_nll is not None else zero
        keep_f = keep.to(torch.float32).unsqueeze(1)  # (N, 1): padding rows get no gradient
        on_softmax = (gs + gn) * keep_f  # (N, 1) weight of softmax(z)
        on_ref = (gs * (1.0 - eps) + gn) * keep_f  # (N, 1) subtracted at the reference id
        never = list(NEVER_TARGET)
        on_all = gs * (eps / (v - len(never))) * keep_f  # (N, 1) subtracted at every target id
        fused = _fused_kernels(logits)
        if fused:
            return fused[1](logits, target, lse, on_softmax, on_ref, on_all), None, None, None
        grad = torch.empty_like(logits)
        rows = block_rows(logits)
        for a in range(0, logits.size(0), rows):
            b = a + rows
            # softmax(z) = exp(z - lse), in a new float32 block (never in place on the logits)
            g = logits[a:b].to(torch.float32, copy=True).sub_(lse[a:b]).exp_()  # (rows, V)
            g.mul_(on_softmax[a:b]).sub_(on_all[a:b])
            g[:, never] += on_all[a:b]  # no smoothing mass on PAD and BOS
            g.scatter_add_(1, target[a:b].unsqueeze(1), on_ref[a:b].neg())
            grad[a:b] = g
        return grad, None, None, None


@torch.no_grad()
def token_losses(logits: Tensor, target: Tensor, eps: float, pad_id: int = PAD_ID
                 ) -> tuple[Tensor, Tensor]:
    """The two per-token terms `aiayn.training.loss.label_smoothed_loss` sums, without
    gradients: label-smoothed loss and NLL of each target token, float32, 0 at padding (what
    evaluation's perplexity sums). logits (B, T, V), target (B, T) -> (B, T) each (or (N, V),
    (N,) -> (N,))."""
    flat = logits.reshape(-1, logits.size(-1))  # (N, V)
    fused = _fused_kernels(flat)  # on a GPU: no float32 copies of the logits at evaluation either
    nll, uniform, _ = (fused[0] if fused else _blocked_terms)(flat, target.reshape(-1))
    pad = target.reshape(-1) == pad_id
    nll = nll.masked_fill_(pad, 0.0)
    smoothed = (1.0 - eps) * nll + eps * uniform.masked_fill_(pad, 0.0) if eps > 0 else nll
    return smoothed.view(target.shape), nll.view(target.shape)
