"""bf16-mixed precision: fp32 masters, bf16 GEMMs, against transformers under torch.autocast
and torch.optim.AdamW.

Tolerances. bf16 keeps 8 significant bits: one rounding changes a value by at most 2**-9 of
it. Both sides round every GEMM operand and output to bf16, at nearly the same places (torch
adds the bias before rounding a GEMM's output and computes GELU in bf16 op by op, we round
after the GEMM and compute GELU in fp32), so after two layers logits and gradients differ by a
few roundings: norm-wise 2**-6 (eight roundings' worth) bounds them with room (we measure
about 4.5 roundings at most). The loss is an fp32 mean over rows whose bf16 errors partly
cancel: within 2**-11 (a bf16 loss would miss by 2**-9 of it). The optimizer sees the same
fp32 gradients on both sides, so its update agrees to fp32 rounding.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import nntile
from nntile import ops
from nntile.models import GPT2LMHead
from nntile.optim import SGD, AdamW, LRSchedule
from nntile._core.core import bf16_bits_to_float, float_to_bf16_bits
from tests.test_gpt2 import TILINGS, hf_model, rel, tokens

PARTIAL = TILINGS["partial everywhere"]


def bf(x):
    """x rounded to bf16, as float64."""
    return bf16_bits_to_float(float_to_bf16_bits(np.asarray(x, np.float32))).astype(np.float64)


def hf_loss_and_grads(model, ids, targets, autocast):
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(torch.from_numpy(ids)).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                 torch.from_numpy(targets).reshape(-1))
    loss.backward()
    grads = {n: p.grad.detach().numpy() for n, p in model.named_parameters()}
    return logits.float().detach().numpy(), loss.item(), grads


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_logits_loss_and_gradients_agree_with_autocast(ctx, tied):
    hf = hf_model(tied, torch.float32)
    ids, targets = tokens(1)
    ref_logits, ref_loss, ref_grads = hf_loss_and_grads(hf, ids, targets, autocast=True)
    fp32_logits, _, fp32_grads = hf_loss_and_grads(hf, ids, targets, autocast=False)
    model = GPT2LMHead.from_transformers(hf, PARTIAL, "bf16-mixed")
    logits = model.forward(ids)
    assert rel(logits, ref_logits) < 2 ** -6
    model.zero_grad()
    loss = model.loss(ids, targets)
    assert abs(loss - ref_loss) / ref_loss < 2 ** -11
    model.backward()
    grads = model.gradients()
    assert set(grads) == set(ref_grads)
    for name, ref in ref_grads.items():
        assert rel(grads[name], ref) < 2 ** -6, name
    # bf16 is really used (fp32 would agree to 1e-5), and costs no more than autocast's own
    # distance from fp32, with one rounding to spare
    assert 2 ** -12 < rel(logits, fp32_logits) < rel(ref_logits, fp32_logits) + 2 ** -9
    worst = max(rel(grads[n], fp32_grads[n]) for n in grads)
    assert worst < max(rel(ref_grads[n], fp32_grads[n]) for n in grads) + 2 ** -9
    # masters, gradients and the loss statistics are fp32; GEMM operands bf16
    lm_head = model.wte.weight if tied else model.lm_head
    assert (lm_head.value.dtype, lm_head.grad.dtype, lm_head.copy.dtype) == ("fp32",) * 2 + ("bf16",)
    assert model.ln_f.weight.copy is None and model.loss_value.dtype == "fp32"
    model.unregister()


@pytest.mark.parametrize("write_behind", [False, True], ids=["", "written back"])
def test_fp32_master_update_equals_torch_adamw_on_the_same_gradients(ctx, monkeypatch,
                                                                      write_behind):
    # past GPU memory (nntile.policy.write_behind) each update's tiles are copied to the host
    # after it: the updates must not change
    monkeypatch.setattr(ctx, "writes_behind", write_behind)
    hf = hf_model(False, torch.float32)
    model = GPT2LMHead.from_transformers(hf, PARTIAL, "bf16-mixed")
    schedule = LRSchedule(1e-3, warmup=2, total=6, min_lr=1e-4)
    opt = AdamW(model.named_parameters(), lr=schedule, weight_decay=0.1, max_grad_norm=0.5)
    torch_opt = torch.optim.AdamW(hf.parameters(), lr=1e-3, weight_decay=0.1, foreach=False)
    params = dict(hf.named_parameters())
    for step in range(1, 5):
        ids, targets = tokens(100 + step)
        model.zero_grad()
        model.loss(ids, targets)
        model.backward()
        with torch.no_grad():  # torch updates the same fp32 weights with our fp32 gradients
            for name, grad in model.gradients().items():
                params[name].grad = torch.from_numpy(np.ascontiguousarray(grad))
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 0.5)
        for group in torch_opt.param_groups:
            group["lr"] = schedule(step)
        torch_opt.step()
        opt.step()
        ours = model.state_dict()
        for name, p in params.items():
            assert rel(ours[name], p.detach().numpy()) < 1e-6, (step, name)
    # the bf16 copies the GEMMs read are the updated masters rounded to nearest, bit for bit
    for name, param in model.named_parameters():
        if param.copy is not None:
            np.testing.assert_array_equal(param.copy.to_array(), bf(param.value.to_array()),
                                          err_msg=name)
    model.unregister()


def test_sgd_refreshes_the_copies(ctx):
    hf = hf_model(True, torch.float32)
    model = GPT2LMHead.from_transformers(hf, PARTIAL, "bf16-mixed")
    opt = SGD(model.named_parameters(), lr=0.1, momentum=0.9)
    ids, targets = tokens(7)
    model.zero_grad()
    model.loss(ids, targets)
    model.backward()
    opt.step()
    weight = model.wte.weight
    assert not np.array_equal(weight.value.to_array(), hf.transformer.wte.weight.detach().numpy())
    np.testing.assert_array_equal(weight.copy.to_array(), bf(weight.value.to_array()))
    model.unregister()


TILES = [(3, 4, 5), (2, 7, 3), (5, 5, 5)]  # partial tiles along every axis of [5, 9, 7]


@pytest.mark.parametrize("tiles", TILES, ids=str)
def test_ops_with_bf16_data_and_fp32_accumulators(ctx, rng, tiles):
    """Each op of the mixed column against numpy float64 on the same bf16 inputs."""
    shape = (5, 9, 7)
    x = bf(rng.standard_normal(shape))
    xb = nntile.Tensor.from_array(x.astype(np.float32), tiles, "bf16")
    f32 = lambda a, t=tiles: nntile.Tensor.from_array(np.asarray(a, np.float32), t)  # noqa: E731

    # fp32 results of bf16 inputs: only fp32 rounding
    acc = rng.standard_normal(shape)
    dst = f32(acc)
    ops.add(0.5, xb, 2.0, dst)  # a bf16 branch into the fp32 residual stream
    assert rel(dst.to_array(), 0.5 * x + 2.0 * np.float32(acc)) < 1e-6
    out = f32(np.full(shape, np.nan))
    ops.add_out(1.0, xb, 1.0, f32(acc), out)  # the stream's next state, its last one kept
    assert rel(out.to_array(), x + np.float32(acc)) < 1e-6
    w = bf(rng.standard_normal((7, 6)))
    wb = nntile.Tensor.from_array(w.astype(np.float32), (tiles[2], 4), "bf16")
    c = nntile.Tensor((5, 9, 6), tiles[:2] + (4,), "fp32")
    ops.gemm(1.0, xb, "N", wb, "N", 0.0, c)  # K in partial tiles, accumulated in fp32
    assert rel(c.to_array(), x @ w) < 1e-6
    wgrad = nntile.Tensor((7, 6), (tiles[2], 4), "fp32")
    ops.gemm(1.0, xb, "T", nntile.Tensor.from_array((x @ w).astype(np.float32), tiles[:2] + (4,),
             "bf16"), "N", 0.0, wgrad, ndim=2)
    assert rel(wgrad.to_array(), np.einsum("abk,abn->kn", x, bf(x @ w))) < 1e-6
    bias = nntile.Tensor((7,), (tiles[2],), "fp32")
    ops.sum_bias(1.0, xb, 0.0, bias)
    assert rel(bias.to_array(), x.sum((0, 1))) < 1e-6
    z = bf(rng.standard_normal(shape))
    sums = nntile.Tensor((5, 9), tiles[:2], "fp32")
    ops.sumprod_slice(1.0, xb, nntile.Tensor.from_array(z.astype(np.float32), tiles, "bf16"),
                      0.0, sums, 2)
    assert rel(sums.to_array(), (x * z).sum(2)) < 1e-6

    # bf16 results: one rounding of the float64 result (2**-9), and a little for the fp32
    # arithmetic before it
    def close_bf16(got, want):
        np.testing.assert_allclose(got, want, rtol=2 ** -8, atol=1e-6)

    b = bf(rng.standard_normal(7))
    ybias = nntile.Tensor.from_array(x.astype(np.float32), tiles, "bf16")
    ops.add_bias(1.0, f32(b, (tiles[2],)), 1.0, ybias)
    close_bf16(ybias.to_array(), x + b)
    stats = nntile.Tensor((5, 9, 2), tiles[:2] + (2,), "fp32")
    ops.maxsumexp(xb, stats, 2)
    s = stats.to_array()
    assert rel(s[..., 1], np.exp(x - x.max(2, keepdims=True)).sum(2)) < 1e-6  # fp32 sums
    p = nntile.Tensor.from_array(x.astype(np.float32), tiles, "bf16")
    ops.softmax_inplace(stats, p, 2)
    ref_p = np.exp(x) / np.exp(x).sum(2, keepdims=True)
    close_bf16(p.to_array(), ref_p)
    dp = nntile.Tensor.from_array(x.astype(np.float32), tiles, "bf16")
    ops.softmax_backward(1.0, p, sums, dp, 2)
    pb, sb = bf(p.to_array()), sums.to_array().astype(np.float64)
    close_bf16(dp.to_array(), pb * (x - sb[..., None]))
    gamma, beta = rng.standard_normal(7), rng.standard_normal(7)
    y = nntile.Tensor(shape, tiles, "bf16")
    ln_stats = nntile.Tensor((5, 9, 2), tiles[:2] + (2,), "fp32")
    ops.layernorm_forward(f32(acc), f32(gamma, (tiles[2],)), f32(beta, (tiles[2],)), 1e-5,
                          ln_stats, y)  # fp32 stream in, bf16 GEMM input out
    a32 = np.float32(acc).astype(np.float64)
    norm = (a32 - a32.mean(2, keepdims=True)) / np.sqrt(a32.var(2, keepdims=True) + 1e-5)
    close_bf16(y.to_array(), norm * np.float32(gamma) + np.float32(beta))
    # cast: fp32 -> bf16 rounds to nearest even, as the host conversion does
    casted = nntile.Tensor(shape, tiles, "bf16")
    ops.cast(dst, casted)
    np.testing.assert_array_equal(casted.to_array(), bf(dst.to_array()))


def test_cross_entropy_of_bf16_logits_in_fp32(ctx, rng):
    B, T, V = 3, 5, 11
    logits = bf(3 * rng.standard_normal((B, T, V)))
    labels = rng.integers(0, V, (B, T))
    tiles = (2, 3, 4)
    lt = nntile.Tensor.from_array(logits.astype(np.float32), tiles, "bf16")
    lab = nntile.Tensor.from_array(labels, tiles[:2])
    stats = nntile.Tensor((B, T, 2), tiles[:2] + (2,), "fp32")
    lse = nntile.Tensor((B, T), tiles[:2], "fp32")
    picked = nntile.Tensor((B, T), tiles[:2], "fp32")
    loss = nntile.Tensor((1,), (1,), "fp32")
    ops.cross_entropy(lt, lab, stats, lse, picked, loss, 1.0 / (B * T))
    ref_lse = np.log(np.exp(logits).sum(-1))
    ref = (ref_lse - np.take_along_axis(logits, labels[..., None], -1)[..., 0]).mean()
    assert abs(loss.to_array()[0] - ref) / ref < 1e-6
    ops.cross_entropy_backward(lt, lab, stats, 1.0)
    want = np.exp(logits - ref_lse[..., None])
    np.put_along_axis(want, labels[..., None], np.take_along_axis(want, labels[..., None], -1) - 1, -1)
    np.testing.assert_allclose(lt.to_array(), want, rtol=2 ** -8, atol=1e-6)


def test_dtype_pairs_other_than_bf16_with_fp32_are_refused(ctx):
    b = nntile.Tensor((4, 4), (2, 2), "bf16")
    f = nntile.Tensor((4, 4), (2, 2), "fp32")
    d = nntile.Tensor((4, 4), (2, 2), "fp64")
    with pytest.raises(TypeError, match="bf16 with fp32 accumulators"):
        ops.gemm(1.0, b, "N", b, "N", 0.0, d)
    with pytest.raises(TypeError, match="src is fp32 but dst is bf16"):
        ops.add(1.0, f, 1.0, b)  # an fp32 branch does not round into a bf16 stream
    with pytest.raises(TypeError, match="cast"):
        ops.cast(b, f)  # only fp32 -> bf16
    with pytest.raises(TypeError, match="gemm: A is bf16 but B is fp32"):
        ops.gemm(1.0, b, "N", f, "N", 0.0, f)
    with pytest.raises(TypeError, match="no kernel for dtype bf16 with fp32 accumulators"):
        ops.sum_slice(1.0, b, 0.0, nntile.Tensor((4,), (2,), "fp32"), 1)
    with pytest.raises(ValueError, match="bf16-mixed"):
        GPT2LMHead(nntile.models.GPT2Config(vocab_size=10, n_positions=4, n_embd=4, n_layer=1,
                                            n_head=1), dtype="fp16")


def test_op_stats_count_every_task_by_op_and_kernel_dtype(ctx):
    """Context.op_stats: the per-op table of the GPU bench, from StarPU's task profiling."""
    b = nntile.Tensor((6, 6), (4, 4), "bf16")  # 4 tiles, partial ones among them
    f = nntile.Tensor((6, 6), (4, 4), "fp32")
    ctx.wait()
    ctx.profiling(True)
    ctx.op_stats(), ctx.worker_stats()  # reset the counters
    ops.gemm(1.0, b, "N", b, "N", 0.0, f)  # 4 C tiles x 2 K tiles
    ops.cast(f, b)
    ctx.wait()
    stats, workers = ctx.op_stats(), ctx.worker_stats()
    ctx.profiling(False)
    mixed = "bf16 with fp32 accumulators"
    assert {(s["op"], s["dtype"]): s["tasks"] for s in stats} == {("gemm", mixed): 8,
                                                                   ("cast", mixed): 4}
    assert sum(w["tasks"] for w in workers) == 12
    assert all(s["seconds"] > 0 for s in stats) and ctx.op_stats() == []
