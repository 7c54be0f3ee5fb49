"""What the op table (kernels.h) gives each task and codelet.

Access modes: every tensor op submits its tasks with the modes that the op table's buffers
imply (const buffers are read, W(...) buffers written, and read too only where the task
accumulates into them; other buffers are read and written). EXPECTED is what the tensor ops
passed by hand before the modes came from the table: the derived modes must be the same, W
wherever it was W (StarPU then does not fetch the tile's old contents).

Accumulation: which W buffers a task reads too is each op's rule in NNTILE_ACCUMULATES. Every
scenario runs again with each tile a task opens write-only filled with NaN first: a kernel that
reads what its rule says it writes over would leave NaN. Every op whose rule is beta != 0 adds
beta times what the buffer the rule names held, against numpy.

Columns: the tf32 codelet of every op runs the fp32 CPU kernel (tf32 stores fp32), whatever
its kind (X_TF32 ops have tf32 CUDA kernels of their own)."""
import numpy as np
import pytest

import nntile
from nntile import ops
from nntile._core import core
from tests.kernel_header import accumulates, op_table

# While a list, T appends every tensor it makes to it (the tensors a scenario leaves).
_made = None


def T(shape, tiles, dtype="fp32", value=None):
    t = nntile.Tensor(shape, tiles, dtype)
    rng = np.random.default_rng(0)
    t.write(rng.standard_normal(shape) if value is None else np.full(shape, value))
    if _made is not None:
        _made.append(t)
    return t


def _scenarios():
    """name -> a function that runs tensor ops on small tensors of two tiles along the axes
    that matter (so that the first tile and the later ones are both seen)."""
    x = lambda: T((4, 6), (2, 3))  # noqa: E731
    fib = lambda: T((6,), (3,))  # noqa: E731
    sl = lambda: T((4,), (2,))  # noqa: E731
    stats = lambda: T((4, 2), (2, 2))  # noqa: E731

    def gemm():
        C = T((4, 5), (2, 5))
        ops.gemm(1.0, x(), "N", T((6, 5), (3, 5)), "N", 0.0, C)
        ops.gemm(1.0, x(), "N", T((6, 5), (3, 5)), "N", 1.0, C)

    def softmax():
        s = stats()
        X = x()
        ops.maxsumexp(X, s, 1)
        ops.softmax_inplace(s, X, 1)
        sums = sl()
        ops.sumprod_slice(1.0, X, x(), 0.0, sums, 1)
        ops.softmax_backward(1.0, X, sums, x(), 1)

    def layernorm():
        X, s, y = x(), stats(), x()
        ops.layernorm_forward(X, fib(), fib(), 1e-5, s, y)
        ops.layernorm_backward(X, x(), s, fib(), 1e-5, stats(), fib(), fib(), 0.0, x())
        ops.layernorm_backward(X, x(), s, fib(), 1e-5, stats(), fib(), fib(), 1.0, x())
        row, whole = (lambda: T((4, 6), (2, 6))), (lambda: T((6,), (6,)))  # a row in one tile
        ops.layernorm_backward(row(), row(), s, whole(), 1e-5, stats(), whole(), whole(), 1.0,
                               row())

    def xent():
        labels = nntile.Tensor((4,), (2,), "int64")
        labels.write(np.array([0, 5, 3, 1]))
        logits, s = x(), stats()
        ops.cross_entropy(logits, labels, s, sl(), sl(), T((1,), (1,)))
        ops.cross_entropy_backward(logits, labels, s)

    def embedding():
        ids = nntile.Tensor((4,), (2,), "int64")
        ids.write(np.array([0, 5, 3, 1]))
        table, dst = T((6, 6), (3, 3)), T((4, 6), (2, 3))
        ops.embedding(ids, table, dst)
        ops.embedding_backward(ids, dst, table)

    def optim():
        p, g = fib(), fib()
        normsq = T((1,), (1,))
        ops.adam_step(1, 1e-3, 0.9, 0.99, 1e-8, 0.0, True, p, g, fib(), fib())
        ops.adam_step(2, 1e-3, 0.9, 0.99, 1e-8, 0.0, True, p, g, fib(), fib(), normsq, 1.0)
        for momentum, step in ((0.0, 2), (0.9, 1), (0.9, 2)):
            # without momentum the task opens buf write-only and leaves it unwritten
            # (undefined after), so that buf is not among the tensors compared
            buf = fib() if momentum else nntile.Tensor((6,), (3,))
            ops.sgd_step(step, 1e-3, momentum, 0.0, 0.0, False, p, g, buf, normsq, 1.0)

    def mixed():
        p, copy = fib(), T((6,), (3,), "bf16")
        ops.adam_step(1, 1e-3, 0.9, 0.99, 1e-8, 0.0, True, p, fib(), fib(), fib(), copy=copy)
        ops.cast(fib(), copy)

    def attention():
        X = T((2, 4, 2, 3), (1, 2, 2, 3))
        S = T((2, 2, 4, 4), (1, 2, 2, 2))
        ops.attn_qk(1.0, X, T((2, 4, 2, 3), (1, 2, 2, 3)), S)
        ops.attn_pv(1.0, S, X, T((2, 4, 2, 3), (1, 2, 2, 3)))
        ops.attn_ptv(1.0, S, X, T((2, 4, 2, 3), (1, 2, 2, 3)))
        ops.mask_scores(S)
        ops.add_bias(1.0, T((2, 3), (2, 3)), 0.0, X)
        ops.add_bias(1.0, T((2, 3), (2, 3)), 1.0, X)
        ops.sum_bias(1.0, X, 0.0, T((2, 3), (2, 3)))

    def llama():
        X, stats = x(), sl()
        ops.rmsnorm_forward(X, fib(), 1e-5, stats, x())
        ops.rmsnorm_backward(X, x(), stats, fib(), 1e-5, sl(), fib(), 0.0, x())
        row = lambda: T((4, 6), (2, 6))  # noqa: E731 (a row in one tile)
        X = row()
        ops.rmsnorm_backward(X, row(), stats, T((6,), (6,)), 1e-5, sl(), T((6,), (6,)), 0.0,
                             row())
        pos = nntile.Tensor((2, 4), (1, 2), "int64")
        pos.write(np.arange(8).reshape(2, 4))
        q = T((2, 4, 2, 6), (1, 2, 1, 6))
        ops.rope_forward(q, pos, T((3,), (3,)))
        ops.rope_backward(q, pos, T((3,), (3,)))
        ops.swiglu_forward(x(), x(), x())
        ops.swiglu_backward(x(), x(), x(), x(), x())

    def flash():
        # two query and key tiles: causality leaves three tasks, the later key tile of the
        # second query tile merging into forward's o and lse and into backward's dq, the
        # second query tile's first key tile adding into dk and dv
        qkv = lambda: T((1, 4, 2, 3), (1, 2, 2, 3))  # noqa: E731
        q, k, v, o, lse = qkv(), qkv(), qkv(), qkv(), T((1, 4, 2), (1, 2, 2))
        ops.flash_attention(q, k, v, o, lse, 0.5)
        ops.flash_attention_backward(q, k, v, o, qkv(), lse, qkv(), qkv(), qkv(), 0.5)

    return {
        "fill": lambda: ops.fill(1.0, x()),
        "copy": lambda: ops.copy(x(), x()),
        "copy_retile": lambda: ops.copy(x(), T((4, 6), (4, 6))),
        "copy_into": lambda: ops.copy_into(T((2, 6), (2, 3)), x(), (1, 0)),
        "add": lambda: (ops.add(1.0, x(), 0.0, x()), ops.add(1.0, x(), 2.0, x())),
        "add_out": lambda: ops.add_out(1.0, x(), 1.0, x(), x()),
        "scal": lambda: ops.scal(2.0, x()),
        "prod": lambda: ops.prod(2.0, x(), x(), x()),
        "unary": lambda: (ops.gelu(x(), x()), ops.gelutanh(x(), x())),
        "unary_backward": lambda: (ops.gelu_backward(x(), x(), 0.0, x()),
                                   ops.gelutanh_backward(x(), x(), 1.0, x())),
        "silu": lambda: (ops.silu(x(), x()), ops.silu_backward(x(), x(), 1.0, x())),
        "fiber": lambda: (ops.add_fiber(1.0, fib(), 0.0, x(), 1),
                          ops.add_fiber(1.0, fib(), 1.0, x(), 1),
                          ops.prod_fiber(1.0, fib(), x(), 1),
                          ops.sum_fiber(1.0, x(), 0.0, fib(), 1),
                          ops.sumprod_fiber(1.0, x(), x(), 1.0, fib(), 1)),
        "slice": lambda: (ops.sum_slice(1.0, x(), 0.0, sl(), 1),
                          ops.sumprod_slice(1.0, x(), x(), 1.0, sl(), 1),
                          ops.add_slice(1.0, sl(), 0.0, x(), 1),
                          ops.add_slice(1.0, sl(), 0.5, x(), 1),
                          ops.prod_slice(1.0, sl(), x(), 1)),
        "gemm": gemm,
        "softmax": softmax,
        "logsumexp": lambda: ops.logsumexp(stats(), sl()),
        "layernorm": layernorm,
        "xent": xent,
        "embedding": embedding,
        "sumsq": lambda: (ops.sumsq(x(), 0.0, T((1,), (1,))), ops.sumsq(x(), 1.0, T((1,), (1,)))),
        "optim": optim,
        "mixed": mixed,
        "attention": attention,
        "llama": llama,
        "flash": flash,
    }


def recorded(name):
    """(op, modes) of the tasks that scenario ``name`` submits, each distinct pair once, in
    the order first seen."""
    run = _scenarios()[name]
    core._record_tasks(True)
    try:
        run()
    finally:
        tasks = core._record_tasks(False)
    return list(dict.fromkeys(tasks))


EXPECTED = {
    'fill': [
        ('fill', ('W',)),
    ],
    'copy': [
        ('fill', ('W',)),
        ('copy', ('R', 'W')),
    ],
    'copy_retile': [
        ('fill', ('W',)),
        ('subcopy', ('R', 'W')),
        ('subcopy', ('R', 'RW')),
    ],
    'copy_into': [
        ('fill', ('W',)),
        ('subcopy', ('R', 'RW')),
    ],
    'add': [
        ('fill', ('W',)),
        ('add', ('R', 'W')),
        ('add', ('R', 'RW')),
    ],
    'add_out': [
        ('fill', ('W',)),
        ('add_out', ('R', 'R', 'W')),
    ],
    'scal': [
        ('fill', ('W',)),
        ('scal', ('RW',)),
    ],
    'prod': [
        ('fill', ('W',)),
        ('prod', ('R', 'R', 'W')),
    ],
    'unary': [
        ('fill', ('W',)),
        ('gelu', ('R', 'W')),
        ('gelutanh', ('R', 'W')),
    ],
    'unary_backward': [
        ('fill', ('W',)),
        ('gelu_backward', ('R', 'R', 'W')),
        ('gelutanh_backward', ('R', 'R', 'RW')),
    ],
    'fiber': [
        ('fill', ('W',)),
        ('add_fiber', ('R', 'W')),
        ('add_fiber', ('R', 'RW')),
        ('prod_fiber', ('R', 'RW')),
        ('sum_fiber', ('R', 'W')),
        ('sum_fiber', ('R', 'RW')),
        ('sumprod_fiber', ('R', 'R', 'RW')),
    ],
    'slice': [
        ('fill', ('W',)),
        ('sum_slice', ('R', 'W')),
        ('sum_slice', ('R', 'RW')),
        ('sumprod_slice', ('R', 'R', 'RW')),
        ('add_slice', ('R', 'W')),
        ('add_slice', ('R', 'RW')),
        ('prod_slice', ('R', 'RW')),
    ],
    'gemm': [
        ('fill', ('W',)),
        ('gemm', ('R', 'R', 'W')),
        ('gemm', ('R', 'R', 'RW')),
    ],
    'softmax': [
        ('fill', ('W',)),
        ('maxsumexp', ('R', 'W')),
        ('maxsumexp', ('R', 'RW')),
        ('softmax_inplace', ('R', 'RW')),
        ('sumprod_slice', ('R', 'R', 'W')),
        ('sumprod_slice', ('R', 'R', 'RW')),
        ('softmax_backward', ('R', 'R', 'RW')),
    ],
    'logsumexp': [
        ('fill', ('W',)),
        ('logsumexp', ('R', 'W')),
    ],
    'layernorm': [
        ('fill', ('W',)),
        ('layernorm_stats', ('R', 'W')),
        ('layernorm_stats', ('R', 'RW')),
        ('layernorm_forward', ('R', 'R', 'R', 'R', 'W')),
        ('layernorm_backward_reduce', ('R', 'R', 'R', 'R', 'W', 'RW', 'RW')),
        ('layernorm_backward_reduce', ('R', 'R', 'R', 'R', 'RW', 'RW', 'RW')),
        ('layernorm_backward', ('R', 'R', 'R', 'R', 'R', 'W')),
        ('layernorm_backward', ('R', 'R', 'R', 'R', 'R', 'RW')),
        ('layernorm_backward_whole', ('R', 'R', 'R', 'R', 'RW', 'RW', 'RW')),
    ],
    'xent': [
        ('fill', ('W',)),
        ('maxsumexp', ('R', 'W')),
        ('maxsumexp', ('R', 'RW')),
        ('logsumexp', ('R', 'W')),
        ('xent_picked', ('R', 'R', 'W')),
        ('xent_picked', ('R', 'R', 'RW')),
        ('xent_loss', ('R', 'R', 'W')),
        ('xent_loss', ('R', 'R', 'RW')),
        ('xent_grad_inplace', ('R', 'R', 'RW')),
    ],
    'embedding': [
        ('fill', ('W',)),
        ('embedding', ('R', 'R', 'RW')),
        ('embedding_backward', ('R', 'R', 'RW')),
    ],
    'sumsq': [
        ('fill', ('W',)),
        ('sumsq', ('R', 'W')),
        ('sumsq', ('R', 'RW')),
    ],
    'optim': [
        ('fill', ('W',)),
        ('adam_step', ('RW', 'R', 'RW', 'RW')),
        ('adam_step', ('RW', 'R', 'RW', 'RW', 'R')),
        ('sgd_step', ('RW', 'R', 'W', 'R')),
        ('sgd_step', ('RW', 'R', 'RW', 'R')),
    ],
    'mixed': [
        ('fill', ('W',)),
        ('adam_step_refresh', ('RW', 'R', 'RW', 'RW', 'W')),
        ('cast', ('R', 'W')),
    ],
    'attention': [
        ('fill', ('W',)),
        ('gemm', ('R', 'R', 'W')),
        ('gemm', ('R', 'R', 'RW')),
        ('mask_scores', ('RW',)),
        ('add_fiber', ('R', 'W')),
        ('add_fiber', ('R', 'RW')),
        ('sum_fiber', ('R', 'W')),
        ('sum_fiber', ('R', 'RW')),
    ],
}
# ops that came after the hand-written modes: what their buffers in kernels.h mean
EXPECTED["llama"] = [
    ("fill", ("W",)),
    ("rmsnorm_stats", ("R", "W")), ("rmsnorm_stats", ("R", "RW")),
    ("rmsnorm_forward", ("R", "R", "R", "W")),
    ("rmsnorm_backward_reduce", ("R", "R", "R", "R", "W", "RW")),
    ("rmsnorm_backward_reduce", ("R", "R", "R", "R", "RW", "RW")),
    ("rmsnorm_backward", ("R", "R", "R", "R", "R", "W")),
    ("rmsnorm_backward_whole", ("R", "R", "R", "R", "RW", "W")),
    ("rope_forward", ("R", "R", "RW")), ("rope_backward", ("R", "R", "RW")),
    ("swiglu_forward", ("R", "R", "W")), ("swiglu_backward", ("R", "R", "R", "W", "W")),
]


EXPECTED["silu"] = [
    ("fill", ("W",)), ("silu", ("R", "W")), ("silu_backward", ("R", "R", "RW")),
]
# q, k, v (and backward's o, dout) and lse read; o and lse, dq, dk and dv written by their
# first task and read too by the tasks that add into them
EXPECTED["flash"] = [
    ("fill", ("W",)),
    ("flash_forward", ("R", "R", "R", "W", "W")),
    ("flash_forward", ("R", "R", "R", "RW", "RW")),
    ("flash_backward", ("R",) * 6 + ("W", "W", "W")),
    ("flash_backward", ("R",) * 6 + ("W", "RW", "RW")),
    ("flash_backward", ("R",) * 6 + ("RW", "W", "W")),
]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_access_modes_follow_the_table(ctx, name):
    assert recorded(name) == EXPECTED[name]


def test_every_op_of_the_table_is_recorded():
    """A new op of kernels.h fails here until a scenario submits its tasks."""
    assert set(_scenarios()) == set(EXPECTED)
    covered = {op for tasks in EXPECTED.values() for op, _ in tasks}
    assert [op for op, _, _, _ in op_table() if op not in covered] == []


@pytest.mark.parametrize("op, kind, columns", [(op, kind, columns)
                                               for op, _, kind, columns in op_table()])
def test_tf32_column_runs_the_fp32_cpu_kernel(ctx, op, kind, columns):
    fp32, tf32 = core._codelet_kernels(op, "fp32"), core._codelet_kernels(op, "tf32")
    if columns == "MIXED_ONLY":
        assert fp32 is None and tf32 is None
        assert core._codelet_kernels(op, "bf16_fp32")[0] != 0
        return
    assert fp32[0] != 0 and tf32[0] == fp32[0]
    assert core._codelet_kernels(op, "fp64")[0] != 0
    if op != "copy":  # copy moves bytes, whatever the dtype: codelets.c gives it every column
        assert (core._codelet_kernels(op, "bf16_fp32") is not None) == (columns == "MIXED")


def _left(name, poison):
    """The values of every tensor that scenario ``name`` makes, run with every tile that a
    task opens write-only filled with NaN first (``poison``) or not."""
    global _made
    _made = []
    previous = core._poison_written(poison)
    try:
        _scenarios()[name]()
    finally:
        core._poison_written(previous)
        made, _made = _made, None
    return [t.to_array() for t in made]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_tiles_opened_write_only_are_not_read(ctx, name):
    """A task opens a W buffer write-only unless the op's rule in NNTILE_ACCUMULATES
    (kernels.h) holds of its args; a kernel that reads such a buffer would read NaN here, so
    every scenario must leave the same values, bit for bit."""
    for plain, poisoned in zip(_left(name, False), _left(name, True)):
        assert np.array_equal(plain, poisoned, equal_nan=True)


def _beta_cases():
    """op -> (run(beta, out), out's shape and tiles): the tensor op whose tasks of op take
    the caller's beta on the buffer that NNTILE_ACCUMULATES names, ``out``."""
    x = lambda: T((4, 6), (2, 3))  # noqa: E731
    fib = lambda: T((6,), (3,))  # noqa: E731
    sl = lambda: T((4,), (2,))  # noqa: E731
    X, FIB, SL = ((4, 6), (2, 3)), ((6,), (3,)), ((4,), (2,))

    def layernorm_backward(beta, dx):
        X, s = x(), T((4, 2), (2, 2))
        ops.layernorm_forward(X, fib(), fib(), 1e-5, s, x())
        ops.layernorm_backward(X, x(), s, fib(), 1e-5, T((4, 2), (2, 2)), fib(), fib(), beta, dx)

    def rmsnorm_backward(beta, dx):
        X, s = x(), sl()
        ops.rmsnorm_forward(X, fib(), 1e-5, s, x())
        ops.rmsnorm_backward(X, x(), s, fib(), 1e-5, sl(), fib(), beta, dx)

    row = lambda: T((4, 6), (2, 6))  # noqa: E731 (a row in one tile: backward_whole)
    whole = lambda: T((6,), (6,))  # noqa: E731
    ROW = ((4, 6), (2, 6))

    def layernorm_backward_whole(beta, dx):
        X, s = row(), T((4, 2), (2, 2))
        ops.layernorm_forward(X, whole(), whole(), 1e-5, s, row())
        ops.layernorm_backward(X, row(), s, whole(), 1e-5, T((4, 2), (2, 2)), whole(), whole(),
                               beta, dx)

    def rmsnorm_backward_whole(beta, dx):
        X, s = row(), sl()
        ops.rmsnorm_forward(X, whole(), 1e-5, s, row())
        ops.rmsnorm_backward(X, row(), s, whole(), 1e-5, sl(), whole(), beta, dx)

    cases = {f"{act}_backward": (lambda beta, dx, act=act: getattr(ops, f"{act}_backward")(
        x(), x(), beta, dx), X) for act in ("gelu", "gelutanh", "silu")}
    cases.update({
        "add": (lambda beta, dst: ops.add(1.0, x(), beta, dst), X),
        "add_fiber": (lambda beta, dst: ops.add_fiber(1.0, fib(), beta, dst, 1), X),
        "sum_fiber": (lambda beta, fiber: ops.sum_fiber(1.0, x(), beta, fiber, 1), FIB),
        "sumprod_fiber": (lambda beta, fiber: ops.sumprod_fiber(1.0, x(), x(), beta, fiber, 1),
                          FIB),
        "sum_slice": (lambda beta, dst: ops.sum_slice(1.0, x(), beta, dst, 1), SL),
        "sumprod_slice": (lambda beta, dst: ops.sumprod_slice(1.0, x(), x(), beta, dst, 1), SL),
        "add_slice": (lambda beta, dst: ops.add_slice(1.0, sl(), beta, dst, 1), X),
        "layernorm_backward": (layernorm_backward, X),
        "rmsnorm_backward": (rmsnorm_backward, X),
        "layernorm_backward_whole": (layernorm_backward_whole, ROW),
        "rmsnorm_backward_whole": (rmsnorm_backward_whole, ROW),
        "gemm": (lambda beta, C: ops.gemm(1.0, x(), "N", T((6, 5), (3, 5)), "N", beta, C),
                 ((4, 5), (2, 5))),
        "sumsq": (lambda beta, dst: ops.sumsq(x(), beta, dst), ((1,), (1,))),
    })
    return cases


# ops whose rule is beta != 0 but whose tensor op sets beta itself: cross_entropy sums the
# row tiles' losses into one (scenario "xent")
_OWN_BETA = {"xent_loss"}


def test_every_op_that_accumulates_by_beta_is_checked():
    by_beta = {op for op, rule in accumulates().items()
               if any(when == "a->beta != 0" for _, _, when in rule)}
    assert set(_beta_cases()) == by_beta - _OWN_BETA


@pytest.mark.parametrize("op", sorted(_beta_cases()))
def test_beta_accumulates_into_the_buffer_the_table_names(ctx, op):
    """With beta = 0 the buffer is written over (NaN there does not show); with beta = 0.5
    the same op adds 0.5 times what the buffer held."""
    run, (shape, tiles) = _beta_cases()[op]
    held = np.random.default_rng(1).standard_normal(shape)
    over, acc = T(shape, tiles, value=np.nan), T(shape, tiles)
    acc.write(held)
    run(0.0, over)
    run(0.5, acc)
    assert np.isfinite(over.to_array()).all()
    np.testing.assert_allclose(acc.to_array(), over.to_array() + 0.5 * held, rtol=1e-5,
                               atol=1e-5)
