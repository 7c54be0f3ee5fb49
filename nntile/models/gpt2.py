"""GPT-2 with a language-model head, on tiled tensors (transformers' GPT2LMHeadModel, no dropout)."""
import dataclasses
import json
import os

import numpy as np

from nntile import Tensor, ops
from nntile.nn.layers import Block, Embedding, LayerNorm, Module

TILING_KEYS = ("batch", "seq", "embd", "head", "inner", "vocab")


@dataclasses.dataclass
class GPT2Config:
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int = None
    layer_norm_epsilon: float = 1e-5
    activation_function: str = "gelu_new"
    tie_word_embeddings: bool = True

    def __post_init__(self):
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPT2Config.{name}={value!r} must be a positive integer")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPT2Config: n_embd={self.n_embd} is not divisible by "
                             f"n_head={self.n_head}")
        if self.n_inner is not None and (not isinstance(self.n_inner, int) or self.n_inner < 1):
            raise ValueError(f"GPT2Config.n_inner={self.n_inner!r} must be a positive integer")
        if self.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"GPT2Config.activation_function={self.activation_function!r}: "
                             "only the tanh approximation of GELU (gelu_new) is implemented")

    @property
    def inner(self):
        return self.n_inner or 4 * self.n_embd

    @classmethod
    def from_dict(cls, data):
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})

    @classmethod
    def from_json(cls, path):
        """Reads our own config or a transformers GPT-2 ``config.json``."""
        with open(path) as f:
            data = json.load(f)
        if data.get("model_type", "gpt2") != "gpt2":
            raise ValueError(f"{path}: model_type {data['model_type']!r} is not gpt2")
        return cls.from_dict(data)

    @classmethod
    def from_transformers(cls, hf_config):
        return cls.from_dict(hf_config.to_dict())

    def to_dict(self):
        return dataclasses.asdict(self)

    def num_parameters(self):
        E, V, P, L, I = self.n_embd, self.vocab_size, self.n_positions, self.n_layer, self.inner
        per_layer = 4 * E + (3 * E * E + 3 * E) + (E * E + E) + (E * I + I) + (I * E + E)
        head = 0 if self.tie_word_embeddings else V * E
        return V * E + P * E + L * per_layer + 2 * E + head


class GPT2LMHead(Module):
    """GPT-2 language model. Parameters are named as transformers' ``state_dict`` keys."""

    def __init__(self, config, batch_size, seq_len, tiling=None, dtype="fp32"):
        super().__init__()
        if dtype not in ("fp32", "fp64", "tf32"):
            raise ValueError(f"GPT2LMHead: dtype {dtype!r}; use fp32, tf32 or fp64")
        self.config = config
        self.dtype = dtype
        self.batch_size = batch_size
        self.seq_len = seq_len
        if not 1 <= seq_len <= config.n_positions:
            raise ValueError(f"sequence length {seq_len} must be between 1 and "
                             f"n_positions={config.n_positions}")
        if batch_size < 1:
            raise ValueError(f"batch size {batch_size} must be >= 1")
        self.tiles = self.check_tiling(tiling or {}, config, batch_size, seq_len)
        t = self.tiles
        E, V = config.n_embd, config.vocab_size
        self.wte = self.add_child("transformer.wte", Embedding(V, t["vocab"], E, t["embd"], dtype))
        self.wpe = self.add_child("transformer.wpe", Embedding(
            config.n_positions, min(t["seq"], config.n_positions), E, t["embd"], dtype))
        self.blocks = [self.add_child(f"transformer.h.{i}", Block(config, t, dtype))
                       for i in range(config.n_layer)]
        self.ln_f = self.add_child("transformer.ln_f", LayerNorm(E, t["embd"],
                                                                config.layer_norm_epsilon, dtype))
        if config.tie_word_embeddings:
            self.lm_head = self.wte.weight
        else:
            self.lm_head = self.add_param("lm_head.weight", (V, E), (t["vocab"], t["embd"]), dtype)
        B, T = batch_size, seq_len
        self.ids = Tensor((B, T), (t["batch"], t["seq"]), "int64")
        self.labels = Tensor((B, T), (t["batch"], t["seq"]), "int64")
        self.positions = Tensor.from_array(np.broadcast_to(np.arange(T), (B, T)),
                                           (t["batch"], t["seq"]))
        act = ((B, T, E), (t["batch"], t["seq"], t["embd"]))
        self.x0 = Tensor(*act, dtype)
        self.dx = Tensor(*act, dtype)
        self.dx_other = Tensor(*act, dtype)
        logit_shape = ((B, T, V), (t["batch"], t["seq"], t["vocab"]))
        self.logits = Tensor(*logit_shape, dtype)
        rows = ((B, T), (t["batch"], t["seq"]))
        self.xent_stats = Tensor((B, T, 2), (t["batch"], t["seq"], 2), dtype)
        self.lse = Tensor(*rows, dtype)
        self.picked = Tensor(*rows, dtype)
        self.loss_value = Tensor((1,), (1,), dtype)
        self._ready_for_backward = False

    @staticmethod
    def check_tiling(tiling, config, batch_size, seq_len):
        unknown = set(tiling) - set(TILING_KEYS)
        if unknown:
            raise ValueError(f"tiling: unknown keys {sorted(unknown)}; use {list(TILING_KEYS)}")
        sizes = {"batch": batch_size, "seq": seq_len, "embd": config.n_embd,
                 "head": config.n_head, "inner": config.inner, "vocab": config.vocab_size}
        tiles = {}
        for key in TILING_KEYS:
            value = tiling.get(key, sizes[key])
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"tiling[{key!r}]={value!r} must be an integer")
            if not 1 <= value <= sizes[key]:
                raise ValueError(f"tiling[{key!r}]={value} must be between 1 and the "
                                 f"{key} size {sizes[key]}")
            tiles[key] = int(value)
        return tiles

    # ---- parameters in transformers' layout ----------------------------------------------

    def _hf_views(self):
        """(transformers name, its shape, [(our parameter, cut of the transformers array)]).

        Our attention keeps q, k, v apart and heads as their own dimension; transformers joins
        q, k, v in c_attn and flattens heads, so those arrays are cut and reshaped here.
        """
        E, H = self.config.n_embd, self.config.n_head
        for name, param in self.named_parameters():
            if name.split(".")[-2] in ("q", "k", "v"):
                continue
            shape = param.value.shape
            hf_shape = (E, E) if name.endswith("attn.c_proj.weight") else shape
            yield name, hf_shape, [(param, lambda a, shape=shape: a.reshape(shape))]
        for i in range(self.config.n_layer):
            attn = self.blocks[i].attn
            qkv = (attn.q, attn.k, attn.v)
            prefix = f"transformer.h.{i}.attn.c_attn."
            yield prefix + "weight", (E, 3 * E), [
                (layer.weight, (lambda a, j=j, s=layer.weight.value.shape:
                                a[:, j * E:(j + 1) * E].reshape(s)))
                for j, layer in enumerate(qkv)]
            yield prefix + "bias", (3 * E,), [
                (layer.bias, (lambda a, j=j, s=layer.bias.value.shape:
                              a[j * E:(j + 1) * E].reshape(s)))
                for j, layer in enumerate(qkv)]

    def load_state_dict(self, state):
        """Load numpy arrays keyed by transformers' GPT-2 parameter names."""
        for hf_name, hf_shape, pieces in self._hf_views():
            if hf_name not in state:
                raise KeyError(f"state dict has no {hf_name!r}")
            array = np.asarray(state[hf_name])
            if array.shape != hf_shape:
                raise ValueError(f"{hf_name}: shape {array.shape}, the model expects {hf_shape}")
            for param, cut in pieces:
                param.value.write(cut(array))

    def _collect(self, which):
        out = {}
        for hf_name, hf_shape, pieces in self._hf_views():
            arrays = [getattr(param, which).to_array() for param, _ in pieces]
            if len(arrays) == 3:
                lead = hf_shape[:-1]
                arrays = [a.reshape(lead + (-1,)) for a in arrays]
                out[hf_name] = np.concatenate(arrays, axis=-1)
            else:
                out[hf_name] = arrays[0].reshape(hf_shape)
        return out

    def state_dict(self):
        """Parameters as numpy arrays keyed by transformers' names."""
        return self._collect("value")

    def gradients(self):
        """Gradients as numpy arrays keyed by transformers' names."""
        return self._collect("grad")

    @classmethod
    def from_transformers(cls, hf_model, batch_size, seq_len, tiling=None, dtype="fp32"):
        config = GPT2Config.from_transformers(hf_model.config)
        model = cls(config, batch_size, seq_len, tiling, dtype)
        state = {k: v.detach().cpu().numpy() for k, v in hf_model.state_dict().items()}
        model.load_state_dict(state)
        return model

    def to_transformers(self):
        import torch
        from transformers import GPT2Config as HFConfig, GPT2LMHeadModel
        c = self.config
        hf = GPT2LMHeadModel(HFConfig(
            vocab_size=c.vocab_size, n_positions=c.n_positions, n_embd=c.n_embd,
            n_layer=c.n_layer, n_head=c.n_head, n_inner=c.n_inner,
            layer_norm_epsilon=c.layer_norm_epsilon, activation_function=c.activation_function,
            tie_word_embeddings=c.tie_word_embeddings, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0))
        state = self.state_dict()
        torch_dtype = torch.float64 if self.dtype == "fp64" else torch.float32
        hf = hf.to(torch_dtype)
        with torch.no_grad():
            for name, tensor in hf.state_dict().items():
                if name in state:
                    tensor.copy_(torch.from_numpy(np.ascontiguousarray(state[name])))
        return hf

    # ---- forward, loss, backward ---------------------------------------------------------

    def _check_tokens(self, array, what):
        array = np.asarray(array)
        if array.shape != (self.batch_size, self.seq_len):
            raise ValueError(f"{what} has shape {array.shape}; this model was built for "
                             f"[batch, seq] = {(self.batch_size, self.seq_len)}")
        if array.dtype.kind not in "iu":
            raise TypeError(f"{what} must hold integers, got {array.dtype}")
        if array.size and (array.min() < 0 or array.max() >= self.config.vocab_size):
            bad = array[(array < 0) | (array >= self.config.vocab_size)][0]
            raise ValueError(f"{what} holds token id {bad}, outside the vocabulary "
                             f"[0, {self.config.vocab_size})")
        return array

    def _forward(self, input_ids):
        self.ids.write(self._check_tokens(input_ids, "input_ids"))
        self.x0.clear()
        self.wte.forward(self.ids, self.x0)
        self.wpe.forward(self.positions, self.x0)
        x = self.x0
        for block in self.blocks:
            x = block.forward(x)
        h = self.ln_f.forward(x)
        ops.gemm(1.0, h, "N", self.lm_head.value, "T", 0.0, self.logits)
        self._h = h
        return self.logits

    def forward(self, input_ids):
        """Logits [batch, seq, vocab] as a numpy array."""
        self._ready_for_backward = False
        return self._forward(input_ids).to_array()

    def loss(self, input_ids, targets):
        """Mean cross-entropy of next-token targets (already shifted), as a float; the
        activations are kept for ``backward``."""
        input_ids = self._check_tokens(input_ids, "input_ids")
        self.labels.write(self._check_tokens(targets, "targets"))
        self.submit_loss(input_ids)
        return float(self.loss_value.to_array()[0])

    def submit_loss(self, input_ids):
        """Submit forward and loss without waiting (the loss stays in ``loss_value``)."""
        logits = self._forward(input_ids)
        scale = 1.0 / (self.batch_size * self.seq_len)
        ops.cross_entropy(logits, self.labels, self.xent_stats, self.lse, self.picked,
                          self.loss_value, scale)
        self._ready_for_backward = True

    def backward(self):
        """Accumulate every parameter's gradient of the last ``loss``."""
        if not self._ready_for_backward:
            raise RuntimeError("backward() needs a loss() first (forward() alone keeps no loss)")
        self._ready_for_backward = False
        scale = 1.0 / (self.batch_size * self.seq_len)
        dlogits = self.logits
        ops.cross_entropy_backward(dlogits, self.labels, self.xent_stats, scale)
        ops.gemm(1.0, dlogits, "T", self._h, "N", 1.0, self.lm_head.grad, ndim=2)
        dh = self.dx_other
        ops.gemm(1.0, dlogits, "N", self.lm_head.value, "N", 0.0, dh)
        dx, other = self.dx, self.dx_other
        # StarPU orders the reuse of dx_other after ln_f has read it (data dependencies).
        self.ln_f.backward(dh, dx, 0.0)
        for block in reversed(self.blocks):
            block.backward(dx, other)
            dx, other = other, dx
        self.wte.backward(dx)
        self.wpe.backward(dx)
