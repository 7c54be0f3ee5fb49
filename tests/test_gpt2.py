"""GPT-2 on StarPU against transformers' GPT2LMHeadModel: same weights, same numbers."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from nntile.models import GPT2Config, GPT2LMHead
from nntile.optim import AdamW, LRSchedule
from tests.devices import atomic_sums

B, T = 2, 37
CONFIG = dict(vocab_size=1000, n_positions=64, n_embd=96, n_layer=2, n_head=3)
TILINGS = {
    "one tile": {},
    "regular": dict(batch=1, seq=37, embd=48, head=1, inner=192, vocab=500),
    "partial everywhere": dict(batch=1, seq=10, embd=40, head=2, inner=100, vocab=300),
}


def hf_model(tied, dtype):
    torch.manual_seed(0)
    config = transformers.GPT2Config(**CONFIG, n_inner=None, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, tie_word_embeddings=tied)
    model = transformers.GPT2LMHeadModel(config).to(dtype)
    with torch.no_grad():  # larger-than-default weights so every path carries signal
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return model.eval()


def rel(a, b):
    return np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-30)


def tokens(seed):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, CONFIG["vocab_size"], (B, T)),
            rng.integers(0, CONFIG["vocab_size"], (B, T)))


def hf_loss_and_grads(model, ids, targets):
    model.zero_grad()
    logits = model(torch.from_numpy(ids)).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             torch.from_numpy(targets).reshape(-1))
    loss.backward()
    grads = {n: p.grad.detach().numpy() for n, p in model.named_parameters()}
    return logits.detach().numpy(), loss.item(), grads


@pytest.mark.parametrize("tiling", list(TILINGS), ids=list(TILINGS))
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("dtype, tol", [("fp32", 1e-5), ("fp64", 1e-10)])
def test_parity_with_transformers(ctx, tiling, tied, dtype, tol):
    torch_dtype = torch.float32 if dtype == "fp32" else torch.float64
    hf = hf_model(tied, torch_dtype)
    ids, targets = tokens(1)
    ref_logits, ref_loss, ref_grads = hf_loss_and_grads(hf, ids, targets)
    model = GPT2LMHead.from_transformers(hf, TILINGS[tiling], dtype)
    check_against(model, (ref_logits, ref_loss, ref_grads), ids, targets, tol)
    model.unregister()


def check_against(model, ref, ids, targets, tol):
    """Our logits, loss and gradients on (ids, targets) within ``tol`` (relative, in norm) of
    ``ref``, the reference's (logits, loss, {name: gradient})."""
    ref_logits, ref_loss, ref_grads = ref
    assert rel(model.forward(ids), ref_logits) < tol
    # another [batch, seq] shape through the same model: causal, so a prefix's logits agree
    prefix = ids.shape[1] // 2 + 1
    assert rel(model.forward(ids[:1, :prefix]), ref_logits[:1, :prefix]) < tol
    model.zero_grad()
    loss = model.loss(ids, targets)
    assert abs(loss - ref_loss) / abs(ref_loss) < tol
    model.backward()
    grads = model.gradients()
    assert set(grads) == set(ref_grads)
    bad = {name: rel(grads[name], ref) for name, ref in ref_grads.items()
           if not rel(grads[name], ref) < tol}
    assert not bad


def test_the_tiles_of_the_situation_as_a_model_takes_them(ctx):
    """The tiles nntile.policy picks for this Context's workers (cli_common.default_tiles:
    here the batch in one tile per worker that runs the model: the CPU workers, or the GPU's),
    given to a model, compute the same numbers as transformers on a batch of 3 (tiles of 2 and
    1). A model given no tiling takes its config's (one tile per dimension) and asks nothing of
    the running Context."""
    from types import SimpleNamespace
    from nntile.cli_common import default_tiles
    hf = hf_model(False, torch.float32)
    workers = ctx.ncuda_workers or ctx.ncpu_workers
    flags = SimpleNamespace(ncpu=ctx.ncpu_workers, ncuda=ctx.ncuda or 0, sched=None)
    choices = default_tiles(GPT2Config(**CONFIG), None, None, {}, flags)
    model = GPT2LMHead.from_transformers(hf, {k: v for k, (v, _) in choices.items()}, "fp32")
    assert model.tiles["batch"] is None and model.batch_count == workers
    rng = np.random.default_rng(3)
    ids = rng.integers(0, CONFIG["vocab_size"], (3, T))
    targets = rng.integers(0, CONFIG["vocab_size"], (3, T))
    ref_logits, ref_loss, _ = hf_loss_and_grads(hf, ids, targets)
    assert rel(model.forward(ids), ref_logits) < 1e-5
    model.unregister()
    plain = GPT2LMHead(GPT2Config(**CONFIG), create=False)
    assert plain.batch_count == 1 and plain.tiles["batch"] is None
    assert plain.tiles["vocab"] == CONFIG["vocab_size"] and plain.tiles["embd"] == 96


def adamw_like_torch(hf, model, batches, loss_and_grads=hf_loss_and_grads):
    """AdamW with warmup, decay to a floor, weight decay and gradient clipping, on our model
    and on transformers' (torch.optim.AdamW), one step per batch (ids, targets): each step's
    loss agrees within 1e-5. Returns our weights after the last step."""
    schedule = LRSchedule(1e-3, warmup=3, total=len(batches), min_lr=1e-4)
    opt = AdamW(model.named_parameters(), lr=schedule, weight_decay=0.1, max_grad_norm=0.5)
    torch_opt = torch.optim.AdamW(hf.parameters(), lr=1e-3, weight_decay=0.1, foreach=False)
    for step, (ids, targets) in enumerate(batches, 1):
        _, ref_loss, _ = loss_and_grads(hf, ids, targets)
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 0.5)
        for group in torch_opt.param_groups:
            group["lr"] = schedule(step)
        torch_opt.step()
        model.zero_grad()
        loss = model.loss(ids, targets)
        model.backward()
        opt.step()
        assert abs(loss - ref_loss) / ref_loss < 1e-5
    return model.state_dict()


def test_adamw_with_warmup_and_clipping_matches_torch(ctx):
    hf = hf_model(False, torch.float32)
    model = GPT2LMHead.from_transformers(hf, TILINGS["partial everywhere"], "fp32")
    ours = adamw_like_torch(hf, model, [tokens(100 + step) for step in range(1, 11)])
    E = CONFIG["n_embd"]
    bad = {}
    for name, p in hf.named_parameters():
        ref = p.detach().numpy()
        mine = ours[name]
        if name.endswith("attn.c_attn.bias"):
            # The key bias adds the same q.b_k to every score of a query, which softmax
            # ignores: its exact gradient is 0, and both sides compute rounding noise that
            # Adam normalises into full-size steps. Checked apart, by the step size bound.
            key = slice(E, 2 * E)
            assert np.abs(mine[key] - ref[key]).max() <= 2 * 10 * 1e-3
            mine, ref = np.delete(mine, np.s_[E:2 * E]), np.delete(ref, np.s_[E:2 * E])
        if not rel(mine, ref) < 1e-5:
            bad[name] = rel(mine, ref)
    assert not bad
    model.unregister()


def test_backward_drops_what_forward_kept_and_changes_no_number(ctx):
    """free_activations (the default) invalidates each block's activations once backward has
    read them: after a step StarPU holds no valid copy of any, and three AdamW steps give the
    same losses and weights, bit for bit, as a model that keeps them."""
    hf = hf_model(False, torch.float32)
    runs = {}
    for free in (True, False):
        model = GPT2LMHead.from_transformers(hf, TILINGS["partial everywhere"], "fp32")
        model.free_activations = free
        opt = AdamW(model.named_parameters(), lr=1e-3, weight_decay=0.1)
        losses = []
        for step in range(3):
            ids, targets = tokens(200 + step)
            model.zero_grad()
            losses.append(model.loss(ids, targets))
            model.backward()
            opt.step()
        ctx.wait()
        kept = [(name, t) for block in model.blocks for name, t in block.kept_buffers()]
        # a block keeps x1, out; ln_1's and ln_2's stats, y; q, k, v, both c_proj's and
        # c_fc's y; the attention core's o and lse (fused, the default); the MLP's g
        assert len(kept) == 15 * CONFIG["n_layer"]
        valid = {name: t.valid_tiles() for name, t in kept}
        if free:
            assert not any(valid.values()), valid
        else:
            assert all(valid[name] == t.ntiles for name, t in kept), valid
        runs[free] = losses, model.state_dict()
        model.unregister()
    assert runs[True][0] == runs[False][0]
    for name, weights in runs[False][1].items():
        np.testing.assert_array_equal(runs[True][1][name], weights, err_msg=name)


def same_with_recompute(ctx, make, batches):
    """``make(recompute)`` builds a model; two AdamW steps on ``batches`` ((ids, targets),
    of several shapes) give the same losses and gradients, bit for bit (on a GPU the
    embedding's to fp32 rounding: tests/devices.py, atomic_sums), with recomputation
    of every block, and of the first block only, as without; between forward and backward
    each recomputing block keeps only its output, and the others all they keep; backward
    recomputes no block's MLP output projection (its y stays dropped)."""
    runs = {}  # by repr: 1 == True as dict keys
    for recompute in (False, True, 1):
        model = make(recompute)
        unordered = atomic_sums(model)
        model.free_activations = False  # what backward wrote stays to be seen
        opt = AdamW(model.named_parameters(), lr=1e-3, weight_decay=0.1)
        losses, grads = [], []
        for ids, targets in batches:
            model.zero_grad()
            losses.append(model.loss(ids, targets))
            ctx.wait()
            for i, block in enumerate(model.blocks):
                kept = {name for name, t in block.kept_buffers() if t.valid_tiles()}
                assert (kept == {"out"}) == (i < model.recompute), (recompute, i, kept)
            model.backward()
            ctx.wait()
            for i, block in enumerate(model.blocks):
                out_proj = [t for name, t in block.kept_buffers()
                            if name in ("mlp.c_proj.y", "mlp.down_proj.y")]
                assert len(out_proj) == 1
                assert (out_proj[0].valid_tiles() == 0) == (i < model.recompute), (recompute, i)
            grads.append(model.gradients())
            opt.step()
        runs[repr(recompute)] = losses, grads
        model.unregister()
    for recompute in ("True", "1"):
        assert runs[recompute][0] == runs["False"][0]
        for with_it, without in zip(runs[recompute][1], runs["False"][1]):
            assert not [name for name in without if name not in unordered
                        and not np.array_equal(with_it[name], without[name])], recompute
            for name in unordered:  # equal but for the order of their adds
                np.testing.assert_allclose(with_it[name], without[name], rtol=1e-5,
                                           atol=1e-7, err_msg=name)


def batches_of_two_shapes(sample):
    """A full batch from ``sample(seed)`` and a shorter one of one sequence."""
    ids, targets = sample(300)
    short, short_targets = sample(301)
    half = ids.shape[1] // 2
    return [(ids, targets), (short[:1, :half], short_targets[:1, :half])]


@pytest.mark.parametrize("tiling, attention, tied", [("partial everywhere", "fused", False),
                                                     ("regular", "unfused", True)])
def test_recompute_gives_the_same_gradients(ctx, tiling, attention, tied):
    config = GPT2Config(**CONFIG, attention=attention, tie_word_embeddings=tied)

    def make(recompute):
        model = GPT2LMHead(config, TILINGS[tiling], "fp32", recompute=recompute)
        model.init_weights(5)
        return model
    same_with_recompute(ctx, make, batches_of_two_shapes(tokens))


def test_free_buffers_after_an_evaluation_loss(ctx):
    """GPT2LMHead.free_buffers drops what a loss kept (the positions stay): backward then asks
    for a new loss, and the next training step matches transformers."""
    hf = hf_model(False, torch.float32)
    model = GPT2LMHead.from_transformers(hf, TILINGS["regular"], "fp32")
    ids, targets = tokens(7)
    model.loss(ids, targets)
    model.free_buffers()
    ctx.wait()
    kept = dict(model.kept_buffers())
    assert kept["positions"].valid_tiles() == kept["positions"].ntiles
    # written from the host, left as they are
    inputs = ("ids", "labels", "positions", "ids/spare", "labels/spare")
    assert not {name: t.valid_tiles() for name, t in kept.items()
                if name not in inputs and t.valid_tiles()}
    with pytest.raises(RuntimeError, match="needs a loss"):
        model.backward()
    _, ref_loss, ref_grads = hf_loss_and_grads(hf, ids, targets)
    model.zero_grad()
    assert abs(model.loss(ids, targets) - ref_loss) / ref_loss < 1e-5
    model.backward()
    grads = model.gradients()
    for name, ref in ref_grads.items():
        assert rel(grads[name], ref) < 1e-5, name
    model.unregister()


def test_bad_input(ctx):
    with pytest.raises(ValueError, match="divisible"):
        GPT2Config(n_embd=100, n_head=3)
    config = GPT2Config(**CONFIG)
    with pytest.raises(ValueError, match="head"):
        GPT2LMHead(config, {"head": 4})
    with pytest.raises(ValueError, match="vocab"):
        GPT2LMHead(config, {"vocab": 0})
    with pytest.raises(ValueError, match="unknown keys"):
        GPT2LMHead(config, {"heads": 1})
    model = GPT2LMHead(config)
    with pytest.raises(ValueError, match="n_positions"):
        model.forward(np.zeros((1, 65), int))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.forward(np.full((1, 8), 1000))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.loss(np.zeros((1, 8), int), np.full((1, 8), -1))
    with pytest.raises(ValueError, match="batch, seq"):
        model.forward(np.zeros(9, int))
    with pytest.raises(ValueError, match="targets have shape"):
        model.loss(np.zeros((1, 8), int), np.zeros((1, 7), int))
    with pytest.raises(RuntimeError, match="loss"):
        model.backward()
    model.unregister()
