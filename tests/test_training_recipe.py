"""The optimisation recipe of §5, each piece alone: label smoothing, Eq. 3, Adam's settings, loss
normalisation over accumulation, clipping, precision."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from aiayn.errors import UserError
from aiayn.kernels import loss as loss_kernel
from aiayn.model.transformer import Transformer
from aiayn.precision import cpu_has_native_bf16
from aiayn.presets import get_preset
from aiayn.special import BOS_ID, EOS_ID, PAD_ID
from aiayn.training.distributed import DistEnv
from aiayn.training.loss import label_smoothed_loss, label_smoothed_mean
from aiayn.training.precision import Precision, resolve
from aiayn.training.schedule import (
    build_optimizer,
    cooldown_factor,
    learning_rate,
    lr_at,
    peak_learning_rate,
    set_lr,
)
from aiayn.training.step import Updater
from aiayn.training.stream import batch_plan

from helpers import MICRO

# --- label smoothing (§5.4) ---------------------------------------------------------------------


def one_hot_reference(logits, target, eps, pad=PAD_ID):
    """The definition: cross-entropy against q = (1 - eps) one_hot(y) + eps / K on the K = V - 2
    ids other than PAD and BOS (0 on those two), summed over non-padding positions, with an
    explicit (N, V) target matrix."""
    v = logits.size(-1)
    logp = torch.log_softmax(logits.double().reshape(-1, v), dim=-1)
    y = target.reshape(-1)
    uniform = torch.full((v,), 1.0 / (v - 2), dtype=torch.double)
    uniform[[PAD_ID, BOS_ID]] = 0.0
    q = (1 - eps) * F.one_hot(y, v).double() + eps * uniform
    per_pos = -(q * logp).sum(-1)
    keep = y != pad
    nll = -logp.gather(1, y[:, None]).squeeze(1)
    return per_pos[keep].sum(), nll[keep].sum(), int(keep.sum())


def test_smoothed_target_is_a_distribution_off_pad_and_bos():
    """Worked by hand for V = 6 (ids 0-5; PAD 0, BOS 2 excluded, so K = 4), eps = 0.2, uniform
    logits: p(k) = 1/6 for every k, so -log p = log 6 everywhere, and q sums to 1 with
    q(y) = 0.8 + 0.05 = 0.85, q(1) = q(3) = q(5 or 4) = 0.05, q(PAD) = q(BOS) = 0: the smoothed loss
    is log 6; and with logits making p(PAD) tiny, the smoothing term must not see it."""
    out = label_smoothed_loss(torch.zeros(1, 6), torch.tensor([4]), 0.2)
    assert out.smoothed.item() == pytest.approx(math.log(6), rel=1e-6)
    z = torch.zeros(1, 6)
    z[0, PAD_ID] = -30.0  # log p(PAD) ~ -30: would cost eps / V * 30 if PAD were smoothed
    out = label_smoothed_loss(z, torch.tensor([4]), 0.2)
    lse = math.log(5 + math.exp(-30.0))
    assert out.smoothed.item() == pytest.approx(lse, rel=1e-6)  # every smoothed id has z = 0
    lg = z.clone().requires_grad_()
    label_smoothed_loss(lg, torch.tensor([4]), 0.2).smoothed.backward()
    p = torch.softmax(z, -1)[0]
    want = p.clone()
    want[4] -= 0.8
    want[[1, 3, 4, 5]] -= 0.05
    assert torch.allclose(lg.grad[0], want, atol=1e-6)


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g) * 3
    target = torch.randint(4, 11, (3, 5), generator=g)
    target[0, 3:] = PAD_ID
    target[2, 1:] = PAD_ID
    return logits, target


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothing_matches_one_hot_definition(batch, eps):
    logits, target = batch
    out = label_smoothed_loss(logits, target, eps)
    ref_s, ref_nll, n = one_hot_reference(logits, target, eps)
    assert int(out.n_tokens) == n == 15 - 2 - 4
    assert out.smoothed.item() == pytest.approx(ref_s.item(), rel=1e-5)
    assert out.nll.item() == pytest.approx(ref_nll.item(), rel=1e-5)
    assert out.smoothed.dtype == torch.float32


def test_eps_zero_is_plain_nll(batch):
    logits, target = batch
    out = label_smoothed_loss(logits, target, 0.0)
    ce = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), ignore_index=PAD_ID, reduction="sum")
    assert out.smoothed.item() == pytest.approx(ce.item(), rel=1e-6)
    assert out.nll.item() == pytest.approx(ce.item(), rel=1e-6)
    mean_s, mean_nll = label_smoothed_mean(logits, target, 0.0)
    assert mean_s.item() == pytest.approx(ce.item() / 9, rel=1e-6)


def test_padding_positions_do_not_count(batch):
    logits, target = batch
    out = label_smoothed_loss(logits, target, 0.1)
    changed = logits.clone()
    changed[target == PAD_ID] = torch.randn_like(changed[target == PAD_ID]) * 100
    again = label_smoothed_loss(changed, target, 0.1)
    assert again.smoothed.item() == out.smoothed.item() and again.nll.item() == out.nll.item()
    # and their gradient is exactly zero
    lg = logits.clone().requires_grad_()
    label_smoothed_loss(lg, target, 0.1).smoothed.backward()
    assert lg.grad[target == PAD_ID].abs().max().item() == 0.0


def test_smoothing_raises_loss_above_nll_and_low_precision_logits_work(batch):
    logits, target = batch
    out = label_smoothed_loss(logits.bfloat16(), target, 0.1)
    ref_s, _, _ = one_hot_reference(logits.bfloat16().float(), target, 0.1)
    assert out.smoothed.dtype == torch.float32
    assert out.smoothed.item() == pytest.approx(ref_s.item(), rel=1e-5)
    assert out.smoothed.item() > out.nll.item()  # these logits are confident: smoothing costs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_fused_loss_gradient_matches_autograd_of_the_definition(dtype, eps):
    # More rows than one chunk of the fused loss, so chunk boundaries are crossed; both outputs
    # carry gradient (weights 0.7 and 0.2) so each term of the hand-written backward is checked.
    g = torch.Generator().manual_seed(1)
    n, v = loss_kernel._CHUNK_ROWS * 2 + 37, 50
    logits = (torch.randn(n, v, generator=g) * 4).to(dtype)
    target = torch.randint(4, v, (n,), generator=g)
    target[::7] = PAD_ID
    fast = logits.clone().requires_grad_()
    out = label_smoothed_loss(fast, target, eps)
    (0.7 * out.smoothed + 0.2 * out.nll).backward()
    ref = logits.double().requires_grad_()
    s, nll, _ = one_hot_reference(ref, target, eps)
    (0.7 * s + 0.2 * nll).backward()
    assert fast.grad.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-2  # bf16 gradient storage: 8 mantissa bits
    assert torch.allclose(fast.grad.double(), ref.grad, atol=tol, rtol=tol)
    assert out.smoothed.item() == pytest.approx(s.item(), rel=1e-5)
    assert torch.equal(logits, fast.detach())  # the backward works on copies, never in place


# --- the learning rate, Eq. 3 -------------------------------------------------------------------


def test_schedule_is_equation_3():
    d, w = 512, 4000
    for step in (1, 2, 100, 3999, 4000, 4001, 10_000, 100_000):
        expected = d**-0.5 * min(step**-0.5, step * w**-1.5)
        assert learning_rate(step, d, w) == pytest.approx(expected, rel=1e-12)
    assert learning_rate(10, d, w, scale=2.0) == pytest.approx(2 * learning_rate(10, d, w))
    # linear rise, peak exactly at warmup_steps, then inverse square root decay
    assert learning_rate(2000, d, w) == pytest.approx(learning_rate(1000, d, w) * 2)
    peak = learning_rate(w, d, w)
    assert peak == pytest.approx(d**-0.5 * w**-0.5)
    assert learning_rate(w - 1, d, w) < peak and learning_rate(w + 1, d, w) < peak
    assert learning_rate(4 * w, d, w) == pytest.approx(peak / 2)
    cfg = get_preset("base")
    assert peak_learning_rate(cfg) == pytest.approx(512**-0.5 * 4000**-0.5)  # about 7.0e-4
    assert lr_at(replace(cfg, lr_scale=0.5), 7) == pytest.approx(0.5 * learning_rate(7, 512, 4000))
    with pytest.raises(ValueError):
        learning_rate(0, d, w)


def test_cooldown_factor():
    # off: Eq. 3 unchanged at every point of the run
    assert all(cooldown_factor(p, 0.0) == 1.0 for p in (0.0, 0.5, 0.99, 1.0, 3.0))
    # the last 20%: flat, then a straight line from 1 at progress 0.8 down to 0 at 1
    for p, want in ((0.0, 1.0), (0.5, 1.0), (0.8, 1.0), (0.85, 0.75), (0.9, 0.5), (0.95, 0.25),
                    (1.0, 0.0), (1.3, 0.0)):
        assert cooldown_factor(p, 0.2) == pytest.approx(want, abs=1e-12), p
    assert cooldown_factor(0.0, 0.999) == 1.0 and cooldown_factor(0.5, 0.999) < 0.51
    with pytest.raises(ValueError):
        cooldown_factor(-0.1, 0.2)
    for bad in (-0.1, 1.0):
        with pytest.raises(UserError, match="lr_cooldown"):
            replace(get_preset("base"), lr_cooldown=bad)


def test_update_applies_the_cooldown_factor():
    cfg = tiny_cfg()
    g = torch.Generator().manual_seed(4)
    src, tgt = random_batch(g, 4, 6, 6)
    (a, ua), (b, ub) = updater_for(cfg), updater_for(cfg)
    r = ua.update([B(src, tgt)], step=5, lr_factor=0.25)
    assert r.lr == pytest.approx(0.25 * lr_at(cfg, 5))
    ub.update([B(src, tgt)], step=5)
    # Adam's first step moves each weight by about lr: a quarter of the rate, a quarter of the move
    for (name, pa), pb, p0 in zip(a.named_parameters(), b.parameters(), updater_for(cfg)[0].parameters()):
        moved_a, moved_b = (pa - p0).abs().sum().item(), (pb - p0).abs().sum().item()
        if moved_b > 0:
            assert moved_a == pytest.approx(0.25 * moved_b, rel=1e-3), name


def test_adam_has_the_papers_settings():
    cfg = get_preset("base")
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg)
    assert isinstance(opt, torch.optim.Adam)
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-9
    assert opt.defaults["weight_decay"] == 0
    assert opt.defaults["fused"] is True  # on CPU: torch's one-pass kernel


def test_fused_adam_follows_torchs_plain_adam():
    """The fused kernel against torch's per-parameter implementation, over several updates at
    changing rates."""
    cfg = get_preset("base")
    g = torch.Generator().manual_seed(5)
    start = [torch.randn(7, 5, generator=g), torch.randn(11, generator=g)]
    fused = [torch.nn.Parameter(t.clone()) for t in start]
    plain = [torch.nn.Parameter(t.clone()) for t in start]
    opt_f = build_optimizer(fused, cfg)
    opt_p = torch.optim.Adam(plain, lr=1.0, betas=(0.9, 0.98), eps=1e-9, foreach=False)
    for step in range(1, 6):
        grads = [torch.randn(t.shape, generator=g) for t in start]
        for ps, opt in ((fused, opt_f), (plain, opt_p)):
            for p, gr in zip(ps, grads):
                p.grad = gr.clone()
            set_lr(opt, 1e-2 / step)
            opt.step()
    for a, b, s in zip(fused, plain, start):
        assert not torch.equal(a, s)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_batch_plan():
    assert batch_plan(25_000, 1, None, None) == (25_000, 1)
    assert batch_plan(25_000, 1, None, 4096) == (4096, 7)  # ceil(25000 / 4096)
    assert batch_plan(25_000, 2, 5, None) == (2500, 5)
    assert batch_plan(25_000, 4, 2, 1000) == (1000, 2)


# --- one update ---------------------------------------------------------------------------------


class B:
    """A collated batch as the trainer sees it."""

    def __init__(self, src, tgt):
        self.src = src
        self.tgt_in = torch.cat([torch.full((tgt.size(0), 1), BOS_ID), tgt[:, :-1]], 1)
        self.tgt_out = tgt
        self.n_src_tokens = int((src != PAD_ID).sum())
        self.n_tgt_tokens = int((tgt != PAD_ID).sum())


def random_batch(g, n, s, t, v=20):
    src = torch.randint(4, v, (n, s), generator=g)
    tgt = torch.randint(4, v, (n, t), generator=g)
    for i in range(n):  # ragged lengths: pad the tails, end with EOS
        ls, lt = int(torch.randint(2, s + 1, (1,), generator=g)), int(torch.randint(2, t + 1, (1,), generator=g))
        src[i, ls - 1], src[i, ls:] = EOS_ID, PAD_ID
        tgt[i, lt - 1], tgt[i, lt:] = EOS_ID, PAD_ID
    return src, tgt


def tiny_cfg(**kw):
    base = dict(vocab_size=20, d_model=16, d_ff=32, n_layers=1, n_heads=2, p_drop=0.0,
                warmup_steps=4, eps_ls=0.1)
    base.update(kw)
    return replace(MICRO, **base)


def updater_for(cfg, precision="fp32", sgd=False):
    torch.manual_seed(0)
    model = Transformer(cfg)
    # Adam's first step is about sign(gradient), which magnifies rounding noise in tiny gradients;
    # plain SGD shows the gradient itself
    opt = torch.optim.SGD(model.parameters(), lr=1.0) if sgd else build_optimizer(model.parameters(), cfg)
    return model, Updater(model, opt, cfg, Precision(precision, torch.device("cpu")), DistEnv())


def test_update_does_not_depend_on_how_the_batch_is_split():
    """Summed loss / total target tokens: one micro-batch of 6 rows, or 3 micro-batches of
    unequal token counts, give the same update (§5.1 batches reached by accumulation)."""
    cfg = tiny_cfg()
    g = torch.Generator().manual_seed(1)
    src, tgt = random_batch(g, 6, 7, 9)
    m1, u1 = updater_for(cfg, sgd=True)
    m2, u2 = updater_for(cfg, sgd=True)
    r1 = u1.update([B(src, tgt)], step=1)
    parts = [(0, 1), (1, 4), (4, 6)]
    r2 = u2.update([B(src[a:b], tgt[a:b]) for a, b in parts], step=1)
    assert r1.applied and r2.applied
    assert r1.tgt_tokens == r2.tgt_tokens == int((tgt != PAD_ID).sum())
    assert r1.loss == pytest.approx(r2.loss, rel=1e-6) and r1.grad_norm == pytest.approx(r2.grad_norm, rel=1e-5)
    for (k, a), b in zip(m1.state_dict().items(), m2.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=k)
    # the loss reported is per target token and the rate is Eq. 3 at step 1
    m_ref, _ = updater_for(cfg)
    ref = label_smoothed_loss(m_ref(src, B(src, tgt).tgt_in), tgt, cfg.eps_ls)
    assert r1.loss == pytest.approx(ref.smoothed.item() / ref.n_tokens.item(), rel=1e-5)
    assert r1.lr == pytest.approx(lr_at(cfg, 1))
    assert u1.optimizer.param_groups[0]["lr"] == pytest.approx(lr_at(cfg, 1))


def test_update_matches_a_hand_written_adam_step():
    cfg = tiny_cfg()
    g = torch.Generator().manual_seed(2)
    src, tgt = random_batch(g, 4, 6, 6)
    model, u = updater_for(cfg)
    ref_model, _ = updater_for(cfg)
    u.update([B(src, tgt)], step=3)
    out = label_smoothed_loss(ref_model(src, B(src, tgt).tgt_in), tgt, cfg.eps_ls)
    (out.smoothed / out.n_tokens).backward()
    lr = lr_at(cfg, 3)
    for (name, p), p_ref in zip(model.named_parameters(), ref_model.parameters()):
        gr = p_ref.grad
        m = (1 - 0.9) * gr
        v = (1 - 0.98) * gr * gr
        expected = p_ref.detach() - lr * (m / (1 - 0.9)) / ((v / (1 - 0.98)).sqrt() + 1e-9)
        torch.testing.assert_close(p.detach(), expected, rtol=1e-4, atol=1e-6, msg=name)


def test_clipping_bounds_the_gradient_norm():
    cfg = tiny_cfg(clip_norm=0.01)
    g = torch.Generator().manual_seed(3)
    src, tgt = random_batch(g, 4, 6, 6)
    model, u = updater_for(cfg)
    seen = {}
    orig_step = u.optimizer.step

    def spy(*a, **k):
        seen["norm"] = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item()
        return orig_step(*a, **k)

    u.optimizer.step = spy
    r = u.update([B(src, tgt)], step=1)
    assert r.grad_norm > 0.01  # reported before clipping
    assert seen["norm"] == pytest.approx(0.01, rel=1e-4)


@pytest.mark.parametrize("avx512_bf16, amx, native", [(False, False, False), (True, False, True),
                                                      (False, True, True)])
def test_native_bf16_is_the_cpus_own_flags_not_onednns_emulation(monkeypatch, avx512_bf16, amx, native):
    """oneDNN says bf16 is supported on any AVX-512 CPU, where it is emulated and 5x slower than
    fp32 (docs/experiments/performance.md): auto must follow the CPU's BF16 and AMX flags."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True, raising=False)
    assert cpu_has_native_bf16() is native
    assert resolve("auto", torch.device("cpu")) == ("bf16" if native else "fp32")


def test_precision_choices():
    cpu = torch.device("cpu")
    assert resolve("auto", cpu) == ("bf16" if cpu_has_native_bf16() else "fp32")
    assert resolve("fp32", cpu) == "fp32" and resolve("bf16", cpu) == "bf16"
    with pytest.raises(UserError, match="fp16 needs a CUDA"):
        resolve("fp16", cpu)
    with pytest.raises(UserError):
        resolve("fp8", cpu)
    cfg = tiny_cfg()
    g = torch.Generator().manual_seed(4)
    src, tgt = random_batch(g, 4, 6, 6)
    _, u32 = updater_for(cfg)
    _, u16 = updater_for(cfg, "bf16")
    r32, r16 = u32.update([B(src, tgt)], 1), u16.update([B(src, tgt)], 1)
    assert r16.applied and math.isfinite(r16.loss)
    assert r16.loss == pytest.approx(r32.loss, rel=2e-2) and r16.loss != r32.loss


# --- aiayn train --compile ----------------------------------------------------------------------


@pytest.mark.slow
def test_compiled_layers_train_as_the_eager_model_does():
    """`compile_for_training` compiles each encoder and decoder layer in place: the same loss and
    gradients as the eager model (dropout off: the compiled RNG stream differs), over batches of
    new shapes, and the same parameter names, so checkpoints are unchanged."""
    from aiayn.training.step import compile_for_training

    cfg = replace(get_preset("base"), vocab_size=40, d_model=32, d_ff=64, n_heads=4, n_layers=2,
                  p_drop=0.0)
    torch.manual_seed(0)
    eager = Transformer(cfg)
    compiled = Transformer(cfg)
    compiled.load_state_dict(eager.state_dict())
    stepped = compile_for_training(compiled)
    assert stepped is compiled and list(compiled.state_dict()) == list(eager.state_dict())
    g = torch.Generator().manual_seed(5)
    for b, s, t in ((3, 7, 6), (5, 11, 9)):
        src = torch.randint(4, 40, (b, s), generator=g)
        src[0, -2:] = PAD_ID
        tgt = torch.randint(4, 40, (b, t + 1), generator=g)
        tgt[1, -3:] = PAD_ID
        losses = []
        for m in (eager, stepped):
            m.zero_grad()
            out = label_smoothed_loss(m(src, tgt[:, :-1]), tgt[:, 1:], 0.1)
            out.smoothed.backward()
            losses.append(out.smoothed.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-5)
        for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
            assert torch.allclose(p.grad, q.grad, atol=1e-5, rtol=1e-4), name
