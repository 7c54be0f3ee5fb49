"""Generation with a key/value cache: the prompt runs through the model once (prefill), then
each new token runs alone against the keys and values of every token before it.

``KVCache`` holds, for every attention core of a model (nntile.nn.attention.CoreAttention),
the keys and values of ``batch`` sequences of up to ``length`` tokens: [batch, length,
kv heads, head_dim] (grouped-query attention: the kv heads only), tiled as the model tiles
its keys, with sequence tiles of the model's ``seq`` tile. While attached, a core writes
each step's k and v into the cache at the cached length (ops.copy_into, after the rotation)
and runs flash attention of its q against the whole cache under the core's mask at the
cached length (``core.mask.at(length)``): query i sits at key position i + cached length,
so the causal mask hides the keys not written yet and no other mask is needed. The
positions of the new tokens continue from the cached length (CausalLM.forward's ``start``).

``generate`` is what CausalLM.generate and nntile-generate run: greedy decoding, or sampling
with a temperature, top-k and top-p (``token_probs``); each sequence stops at its
end-of-sequence token or at a stop text. Prompts of different lengths run as batches of
prompts of one length, one batch after the other, each against a cache of its own.
"""
from contextlib import contextmanager

import numpy as np

from nntile import ops
from nntile.nn.attention import CoreAttention


def token_probs(logits, temperature=1.0, top_k=0, top_p=1.0):
    """The distribution the next token is drawn from (float64): softmax(logits / temperature),
    cut to the ``top_k`` likeliest tokens (0: all), then to the fewest likeliest whose
    probabilities add up to ``top_p`` at least, renormalised."""
    logits = np.asarray(logits, dtype=np.float64)
    if not np.isfinite(logits).all():
        raise ValueError("the model's logits hold NaN or inf")
    # the largest logit subtracted before dividing: a tiny temperature then sends the others
    # to -inf (probability 0), never to inf - inf = NaN
    with np.errstate(over="ignore"):
        z = (logits - logits.max()) / temperature
    if top_k and top_k < len(z):
        z = np.where(z < np.partition(z, -top_k)[-top_k], -np.inf, z)
    probs = np.exp(z)
    probs /= probs.sum()
    if top_p < 1:
        order = np.argsort(-probs, kind="stable")
        keep = order[:np.searchsorted(np.cumsum(probs[order]), top_p) + 1]
        nucleus = np.zeros_like(probs)
        nucleus[keep] = probs[keep]
        probs = nucleus / nucleus.sum()
    return probs


def pick_token(logits, rng, temperature, top_k, greedy, top_p=1.0):
    """The next token from a vector of logits."""
    if greedy or temperature == 0:
        return int(np.argmax(logits))
    probs = token_probs(logits, temperature, top_k, top_p)
    return int(rng.choice(len(probs), p=probs))


class KVCache:
    """The keys and values of every attention core of ``model`` for ``batch`` sequences of
    up to ``capacity`` tokens (see the module); ``length``: the tokens cached so far.
    ``attached()`` hands the cache to the cores for a block of code; ``step(ids)`` runs the
    model on the next tokens [batch, n] and returns the last one's logits."""

    def __init__(self, model, batch, capacity):
        self.model = model
        self.capacity = capacity
        self.length = 0
        bt, lt = model.data_tiles(batch, capacity)
        self.cores = [m for _, m in model.named_modules() if isinstance(m, CoreAttention)]
        if not all(core.mask.causal for core in self.cores):
            raise ValueError("KVCache: a key/value cache needs causal attention (a key is "
                             "cached before the queries after it see it)")
        self.tensors = {}
        self.outputs = {}  # o and lse of each query shape and dtype, shared by the cores
        for core in self.cores:
            shape = (batch, capacity, core.n_kv_head, core.head_dim)
            tiles = (bt, lt, core.head_tile // core.group, core.head_dim)
            self.tensors[id(core)] = [core.buffer_spec(name, shape, tiles).create()
                                      for name in ("kv_cache.k", "kv_cache.v")]

    @contextmanager
    def attached(self):
        for core in self.cores:
            core.kv_cache = self
        try:
            yield self
        finally:
            for core in self.cores:
                core.kv_cache = None

    def step(self, ids):
        """Logits [batch, vocab] of the last of the next tokens ``ids`` [batch, n] (numpy),
        which join the cache. Of a prompt (n > 1), only the last token runs the head: the
        others run the blocks, whose activations are then dropped (what is read again is in
        the cache)."""
        n = np.shape(ids)[1]
        if self.length + n > self.capacity:
            raise ValueError(f"{n} more tokens do not fit in a cache of {self.capacity} "
                             f"holding {self.length}")
        if n > 1:
            self.model.forward(ids[:, :-1], start=self.length, head=False)
            self.model.free_buffers()
            self.length += n - 1
        logits = self.model.forward(ids[:, -1:], start=self.length)
        self.length += 1
        return logits[:, -1]

    def attend(self, core, q, k, v):
        """What a core attached to the cache runs: k and v written at the cached length,
        then q's attention to every key cached (o, in the core's buffer)."""
        keys, values = self.tensors[id(core)]
        at = (0, self.length, 0, 0)
        ops.copy_into(k, keys, at)
        ops.copy_into(v, values, at)
        o, lse = self._outputs(core, q)
        ops.flash_attention(q, keys, values, o, lse, core.scale, core.mask.at(self.length))
        return o

    def _outputs(self, core, q):
        """Flash attention's o and lse for queries like q (whether the core is fused or not:
        the cache always runs the fused kernels). The cores share them: each core's output
        projection reads o before the next core writes it (StarPU orders the two)."""
        key = (q.shape, q.basetile, q.dtype)
        if key not in self.outputs:
            self.outputs[key] = (
                core.buffer_spec("kv_cache.o", q.shape, q.basetile).create(),
                core.buffer_spec("kv_cache.lse", q.shape[:3], q.basetile[:3],
                                 core.lse_dtype).create())
        return self.outputs[key]

    def unregister(self):
        for tensors in list(self.tensors.values()) + list(self.outputs.values()):
            for tensor in tensors:
                tensor.unregister()
        self.tensors.clear()
        self.outputs.clear()


def _prompts(model, input_ids, max_new_tokens, window):
    """The prompts, one int64 array each (of any lengths), checked before any task is
    submitted: the later batches' too."""
    try:
        prompts = [np.asarray(one) for one in input_ids]
    except (TypeError, ValueError):
        prompts = None
    if not prompts or any(one.ndim != 1 or one.size == 0 or one.dtype.kind not in "iu"
                          for one in prompts):
        raise ValueError("generate: input_ids must be the token ids of each prompt ([batch, "
                         "seq], or a list of prompts of any lengths, none empty)")
    V = model.config.vocab_size
    for i, one in enumerate(prompts):
        if one.min() < 0 or one.max() >= V:
            raise ValueError(f"generate: prompt {i} holds token id "
                             f"{one[(one < 0) | (one >= V)][0]}, outside the vocabulary "
                             f"[0, {V})")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) \
            or max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    P = model.config.max_position_embeddings
    longest = max(len(one) for one in prompts)
    if window is None and longest + max_new_tokens > P:
        raise ValueError(f"generate: a prompt of {longest} tokens and {max_new_tokens} new "
                         f"ones exceed the model's {P} positions (pass a window)")
    if window is not None and not 1 <= window <= P:
        raise ValueError(f"generate: window={window!r} must be between 1 and the model's {P} "
                         "positions")
    return [one.astype(np.int64) for one in prompts]


def generate(model, input_ids, max_new_tokens, temperature=0.0, top_k=0, top_p=1.0, seed=0,
             eos_token_id=None, stop=None, tokenizer=None, window=None, on_token=None):
    """The prompts ``input_ids`` ([batch, seq], or a list of prompts of any lengths)
    continued by up to ``max_new_tokens`` tokens each: a list of the new tokens of each
    prompt (lists of ints), in the order of the prompts. The prompts of one length run as
    one batch, the batches one after the other (no padding). ``temperature`` 0 is greedy
    decoding, else sampling from ``token_probs`` with ``top_k`` and ``top_p`` (numpy's
    Generator seeded ``seed``). A sequence stops after ``eos_token_id`` (default: the
    tokenizer's end-of-text), or after the token that completes ``stop`` in its text (decoded
    by ``tokenizer``), both kept. With a ``tokenizer``, only its tokens are drawn.
    ``window``: the most tokens the model sees (None: prompt and new tokens must fit in its
    positions); a longer text goes on from its later half, run again from position 0.
    ``on_token(i, token)``: called with each new token of prompt i as it comes."""
    prompts = _prompts(model, input_ids, max_new_tokens, window)
    if stop and tokenizer is None:
        raise ValueError("generate: a stop text needs the tokenizer that decodes the tokens")
    if eos_token_id is None and tokenizer is not None:
        eos_token_id = tokenizer.eot
    vocab = tokenizer.vocab_size if tokenizer is not None else model.config.vocab_size
    rng = np.random.default_rng(seed)

    def pick(logits):
        return pick_token(logits[:vocab], rng, temperature, top_k, temperature == 0, top_p)

    def finished(seq):
        return (eos_token_id is not None and seq[-1] == eos_token_id) or \
            bool(stop) and stop in tokenizer.decode(seq)

    new = [[] for _ in prompts]
    by_length = {}  # prompt length -> the prompts of that length, in the order given
    for i, one in enumerate(prompts):
        by_length.setdefault(len(one), []).append(i)
    for rows in by_length.values():
        _continue_batch(model, np.stack([prompts[i] for i in rows]), [new[i] for i in rows],
                        max_new_tokens, pick, finished, window,
                        on_token and (lambda b, token, rows=rows: on_token(rows[b], token)))
    return new


def _continue_batch(model, text, new, max_new_tokens, pick, finished, window, on_token):
    """Prompts of one length, ``text`` [batch, seq], continued as one batch against one
    cache: each sequence's tokens appended to its list of ``new`` until ``finished`` says
    it ends (see generate)."""
    if max_new_tokens == 0:
        return
    done = np.zeros(text.shape[0], dtype=bool)
    capacity = min(text.shape[1] + max_new_tokens, window or model.config.max_position_embeddings)
    cache = KVCache(model, text.shape[0], capacity)
    try:
        with cache.attached():
            logits = cache.step(text[:, -capacity:])
            for step in range(max_new_tokens):
                tokens = np.array([pick(row) for row in logits])
                text = np.concatenate([text, tokens[:, None]], axis=1)
                for b in np.flatnonzero(~done):
                    new[b].append(int(tokens[b]))
                    done[b] = finished(new[b])
                    if on_token is not None:
                        on_token(b, int(tokens[b]))
                if done.all() or step == max_new_tokens - 1:
                    break
                if cache.length == capacity:  # full: the later half again, from position 0
                    cache.length = 0
                    logits = cache.step(text[:, -max(capacity // 2, 1):])
                else:
                    logits = cache.step(tokens[:, None])
    finally:
        cache.unregister()
