# cython: language_level=3
"""GPT-2 with a language-model head on tiled tensors: transformers' GPT2LMHeadModel without
dropout, as a typed Cython class. Parameters are named as transformers' ``state_dict`` keys,
except inside attention, whose fused c_attn is kept as q, k, v so that heads can be tiled."""
import numpy as np

from nntile._core.core cimport Tensor
from nntile._core.core import current_context
from nntile import ops
from nntile.declare import TensorSpec
from nntile.models.config import GPT2Config, TILING_KEYS
from nntile.nn.layers cimport Block, Embedding, LayerNorm, Module, Parameter
from nntile.precision import PRECISIONS


# The model's own buffers that backward reads for the last time once ln_f's backward is
# submitted, and once the embeddings' is (the positions are written once and kept).
_HEAD_BUFFERS = ("logits", "loss/stats", "loss/lse", "loss/picked")
_STREAM_BUFFERS = ("x0", "dx", "dx_other")


cdef class GPT2LMHead(Module):
    """GPT-2 language model over tiles.

    ``tiling`` gives tile sizes for keys batch, seq, embd, head (heads per tile), inner (MLP)
    and vocab; a missing key gets the tile nntile.policy picks for the running Context's
    workers (Context.default_tiles, printed by its describe()), or outside one, one tile for
    that dimension (the vocabulary: tiles of 8192 where it is larger, GPT2Config.sizes).
    Batch and seq tiles are clipped to the data's shape, so any [batch, seq] with seq <=
    n_positions can be used.
    ``dtype`` is a precision (nntile.precision): fp32, tf32, fp64, bf16 or bf16-mixed.

    ``create=False`` builds the layers and their declarations only, and no tensor: what
    ``tensor_specs`` (and nntile.memory) read before StarPU starts. ``block_type`` is the
    class of the transformer blocks (a subclass may change it).
    """
    block_type = Block
    cdef readonly object config
    cdef readonly dict tiles
    cdef readonly list blocks
    cdef readonly Embedding wte, wpe
    cdef readonly LayerNorm ln_f
    cdef readonly Parameter lm_head
    cdef readonly Tensor loss_value
    cdef object _loss_spec
    cdef dict _ws
    cdef Tensor _h
    cdef bint _ready_for_backward
    cdef public bint layer_priorities
    cdef public bint free_activations
    cdef readonly int batch_count  # batch tiles where no batch tile size was given

    def __init__(self, config, tiling=None, str dtype="fp32", bint create=True):
        if dtype not in PRECISIONS:
            raise ValueError(f"GPT2LMHead: dtype {dtype!r}; use {', '.join(PRECISIONS)}")
        if not isinstance(config, GPT2Config):
            raise TypeError(f"GPT2LMHead needs a GPT2Config, got {type(config).__name__}")
        super().__init__(dtype)
        self.config = config
        self.tiles = self.check_tiling(tiling or {}, config)
        self.batch_count = self.tiles.pop("batch_count", 1)
        t = self.tiles
        E, V = config.n_embd, config.vocab_size
        self.wte = self.add_child("transformer.wte", Embedding(
            V, t["vocab"], E, t["embd"], dtype, gemm=config.tie_word_embeddings))
        self.wpe = self.add_child("transformer.wpe", Embedding(
            config.n_positions, min(t["seq"], config.n_positions), E, t["embd"], dtype))
        self.blocks = [self.add_child(f"transformer.h.{i}", self.block_type(config, t, dtype))
                       for i in range(config.n_layer)]
        self.ln_f = self.add_child("transformer.ln_f", LayerNorm(E, t["embd"],
                                                                config.layer_norm_epsilon, dtype))
        if config.tie_word_embeddings:
            self.lm_head = self.wte.weight
        else:
            self.lm_head = self.add_param("lm_head.weight", (V, E), (t["vocab"], t["embd"]),
                                          gemm=True)
        self._loss_spec = TensorSpec("loss_value", (1,), (1,), self.master, "workspaces")
        self._ready_for_backward = False
        # on by default: 2.80 vs 3.33 s per step at 1.23x an H100's memory, no loss in memory
        # (docs/performance.md, "Past GPU memory on one GPU")
        self.layer_priorities = True
        # on by default: backward drops each block's activations once it has read them
        # (Module.free_buffers), so that past GPU memory StarPU does not write them back to
        # host memory: 81 -> 10.6-12.3 s per step at 6.07B, batch 16, on an H100 whose host
        # memory is full (docs/performance.md, "Activations dropped after backward")
        self.free_activations = True
        if create:
            self.create()

    def create(self):
        """Create the parameters' tensors and the loss."""
        Module.create(self)
        self.loss_value = self._loss_spec.create()

    @staticmethod
    def check_tiling(tiling, config):
        unknown = set(tiling) - set(TILING_KEYS)
        if unknown:
            raise ValueError(f"tiling: unknown keys {sorted(unknown)}; use {list(TILING_KEYS)}")
        sizes = {key: size for key, (size, _) in config.sizes().items()}
        defaults = {key: tile for key, (_, tile) in config.sizes().items()}
        ctx = current_context()
        if ctx is not None and hasattr(ctx, "default_tiles"):
            # in a running Context: the tiles nntile.policy picks for its workers
            chosen = ctx.default_tiles(config.sizes(), given=tiling)
            defaults = {key: value for key, (value, _) in chosen.items()}
        tiles = {"batch_count": defaults.pop("batch_count", 1)}
        for key in TILING_KEYS:
            value = tiling.get(key, defaults[key])
            if value is None:  # batch: one tile for the whole batch unless told otherwise
                tiles[key] = None
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"tiling[{key!r}]={value!r} must be an integer")
            if value < 1 or (sizes[key] is not None and value > sizes[key]):
                limit = f"between 1 and the {key} size {sizes[key]}" if sizes[key] else ">= 1"
                raise ValueError(f"tiling[{key!r}]={value} must be {limit}")
            tiles[key] = int(value)
        return tiles

    # ---- what the model holds, declared -------------------------------------------------

    cdef tuple _lead_for(self, int B, int T):
        """[batch, seq] and their tiles (clipped to the data's shape)."""
        cdef int batch_tile = self.tiles["batch"] or -(-B // self.batch_count)
        return (B, T), (min(batch_tile, B), min(self.tiles["seq"], T))

    def declare(self, tuple lead, tuple tiles):
        """The tensors of a [batch, seq] shape of the data: token ids, targets and positions,
        the residual stream x0 and its gradient (ping-pong with dx_other), the logits and
        the loss's statistics. The stream and the statistics are in the master dtype, the
        logits (a GEMM's output) in the compute dtype."""
        cdef tuple x = lead + (self.config.n_embd,), x_tiles = tiles + (self.tiles["embd"],)
        return [self.buffer_spec("ids", lead, tiles, "int64", "workspaces"),
                self.buffer_spec("labels", lead, tiles, "int64", "workspaces"),
                self.buffer_spec("positions", lead, tiles, "int64", "workspaces"),
                self.buffer_spec("x0", x, x_tiles, self.master),
                self.buffer_spec("dx", x, x_tiles, self.master, "workspaces"),
                self.buffer_spec("dx_other", x, x_tiles, self.master, "workspaces"),
                self.buffer_spec("logits", lead + (self.config.vocab_size,),
                                 tiles + (self.tiles["vocab"],), category="logits"),
                self.buffer_spec("loss/stats", lead + (2,), tiles + (2,), self.master,
                                 "workspaces"),
                self.buffer_spec("loss/lse", lead, tiles, self.master, "workspaces"),
                self.buffer_spec("loss/picked", lead, tiles, self.master, "workspaces")]

    def tensor_specs(self, batch=None, seq=None, bint training=True):
        """What this model registers, as TensorSpecs. Without a shape: what the constructor
        creates (parameters, gradients, compute copies, the loss). For [batch, seq]: what
        the first step on data of that shape adds (buffers; with ``training``, backward's
        scratch too)."""
        if batch is None:
            return self.declaration() + [self._loss_spec]
        if not 1 <= seq <= self.config.n_positions or batch < 1:
            raise ValueError(f"[batch, seq] = [{batch}, {seq}]: need batch >= 1 and "
                             f"1 <= seq <= n_positions ({self.config.n_positions})")
        return self.declaration(*self._lead_for(batch, seq), training)

    @property
    def dtype_name(self):
        return self.dtype

    # ---- parameters in transformers' layout ----------------------------------------------

    def _hf_views(self):
        """(transformers name, its shape, [(our parameter, cut of the transformers array)])."""
        E = self.config.n_embd
        for name, param in self.named_parameters():
            if name.split(".")[-2] in ("q", "k", "v"):
                continue
            shape = param.value.shape
            hf_shape = (E, E) if name.endswith("attn.c_proj.weight") else shape
            yield name, hf_shape, [(param, lambda a, shape=shape: a.reshape(shape))]
        for i in range(self.config.n_layer):
            attn = (<Block> self.blocks[i]).attn
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
        """Load numpy arrays keyed by transformers' GPT-2 parameter names (into the master
        weights, and their compute copies)."""
        for hf_name, hf_shape, pieces in self._hf_views():
            if hf_name not in state:
                raise KeyError(f"state dict has no {hf_name!r}")
            array = np.asarray(state[hf_name])
            if array.shape != hf_shape:
                raise ValueError(f"{hf_name}: shape {array.shape}, the model expects {hf_shape}")
            for param, cut in pieces:
                param.write(cut(array))

    def _collect(self, which):
        out = {}
        for hf_name, hf_shape, pieces in self._hf_views():
            arrays = [getattr(param, which).to_array() for param, _ in pieces]
            if len(arrays) == 3:
                arrays = [a.reshape(hf_shape[:-1] + (-1,)) for a in arrays]
                out[hf_name] = np.concatenate(arrays, axis=-1)
            else:
                out[hf_name] = arrays[0].reshape(hf_shape)
        return out

    def state_dict(self):
        """Parameters (the master weights) as numpy arrays keyed by transformers' names."""
        return self._collect("value")

    def gradients(self):
        """Gradients as numpy arrays keyed by transformers' names."""
        return self._collect("grad")

    @classmethod
    def from_transformers(cls, hf_model, tiling=None, dtype="fp32"):
        model = cls(GPT2Config.from_transformers(hf_model.config), tiling, dtype)
        model.load_state_dict({k: v.detach().cpu().numpy()
                               for k, v in hf_model.state_dict().items()})
        return model

    def to_transformers(self):
        """A transformers GPT2LMHeadModel holding a copy of the weights."""
        import torch
        from transformers import GPT2Config as HFConfig, GPT2LMHeadModel
        c = self.config
        hf = GPT2LMHeadModel(HFConfig(
            vocab_size=c.vocab_size, n_positions=c.n_positions, n_embd=c.n_embd,
            n_layer=c.n_layer, n_head=c.n_head, n_inner=c.n_inner,
            layer_norm_epsilon=c.layer_norm_epsilon, activation_function=c.activation_function,
            tie_word_embeddings=c.tie_word_embeddings, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0))
        hf = hf.to(torch.float64 if self.dtype == "fp64" else torch.float32)
        state = self.state_dict()
        with torch.no_grad():
            for name, tensor in hf.state_dict().items():
                if name in state:
                    tensor.copy_(torch.from_numpy(np.ascontiguousarray(state[name])))
        return hf

    # ---- forward, loss, backward ---------------------------------------------------------

    def _check_tokens(self, array, str what):
        array = np.asarray(array)
        if array.ndim != 2:
            raise ValueError(f"{what} must be [batch, seq], got shape {array.shape}")
        if array.shape[0] == 0:
            raise ValueError(f"{what} has shape {array.shape}: the batch is empty")
        if not 1 <= array.shape[1] <= self.config.n_positions:
            raise ValueError(f"{what} has shape {array.shape}: the sequence length must be "
                             f"between 1 and n_positions={self.config.n_positions}")
        if array.dtype.kind not in "iu":
            raise TypeError(f"{what} must hold integers, got {array.dtype}")
        if array.min() < 0 or array.max() >= self.config.vocab_size:
            bad = array[(array < 0) | (array >= self.config.vocab_size)][0]
            raise ValueError(f"{what} holds token id {bad}, outside the vocabulary "
                             f"[0, {self.config.vocab_size})")
        return array

    cdef dict _workspace(self, int B, int T):
        lead = self._lead_for(B, T)
        new = lead not in self._buffers
        cdef dict ws = self._buffers_for(lead)
        if new:
            ws["positions"].write(np.broadcast_to(np.arange(T), (B, T)))
        return ws

    cdef _prioritize(self, int distance):
        """With ``layer_priorities``, tasks submitted next get their distance from the end of
        the step as priority (forward of block i: 2L+2-i, loss: L+2, backward of block i:
        i+1, the optimizer after it: 0), so that where several tasks are ready the scheduler
        runs the one on the critical path, and fetches its tiles, first."""
        if self.layer_priorities:
            ops.set_task_priority(distance)

    cdef Tensor _forward(self, input_ids):
        if self.loss_value is None:
            raise RuntimeError("GPT2LMHead(create=False) declares its tensors but holds none; "
                               "call create() before running it")
        ids = self._check_tokens(input_ids, "input_ids")
        cdef dict ws = self._workspace(ids.shape[0], ids.shape[1])
        self._ws = ws
        ws["ids"].write(ids)
        cdef int L = len(self.blocks), i
        self._prioritize(2 * L + 3)
        cdef Tensor x = ws["x0"]
        x.clear()
        self.wte.forward(ws["ids"], x)
        self.wpe.forward(ws["positions"], x)
        for i in range(L):
            self._prioritize(2 * L + 2 - i)
            x = (<Block> self.blocks[i]).forward(x)
        self._prioritize(L + 2)
        self._h = self.ln_f.forward(x)
        ops.gemm(1.0, self._h, "N", self.lm_head.compute, "T", 0.0, ws["logits"])
        return ws["logits"]

    def forward(self, input_ids):
        """Logits [batch, seq, vocab] as a numpy array."""
        self._ready_for_backward = False
        logits = self._forward(input_ids)
        self._prioritize(0)
        return logits.to_array()

    def loss(self, input_ids, targets):
        """Mean cross-entropy of next-token targets (already shifted) as a float; activations
        are kept for ``backward``."""
        self.submit_loss(input_ids, targets)
        return float(self.loss_value.to_array()[0])

    def submit_loss(self, input_ids, targets):
        """Submit forward and loss without waiting; the loss lands in ``loss_value``."""
        input_ids = self._check_tokens(input_ids, "input_ids")
        targets = self._check_tokens(targets, "targets")
        if targets.shape != input_ids.shape:
            raise ValueError(f"targets have shape {targets.shape} but input_ids {input_ids.shape}")
        cdef Tensor logits = self._forward(input_ids)
        cdef dict ws = self._ws
        ws["labels"].write(targets)
        ops.cross_entropy(logits, ws["labels"], ws["loss/stats"], ws["loss/lse"],
                          ws["loss/picked"], self.loss_value, 1.0 / input_ids.size)
        self._prioritize(0)
        self._ready_for_backward = True

    def backward(self, double scale=1.0):
        """Accumulate every parameter's gradient of the last loss, times ``scale`` (for
        gradient accumulation over micro-batches, pass 1/number of micro-batches)."""
        if not self._ready_for_backward:
            raise RuntimeError("backward() needs a loss() first (forward() alone keeps no loss)")
        self._ready_for_backward = False
        cdef dict ws = self._ws
        cdef Tensor dlogits = ws["logits"], ids = ws["ids"]
        cdef int i
        self._prioritize(len(self.blocks) + 1)
        ops.cross_entropy_backward(dlogits, ws["labels"], ws["loss/stats"],
                                   scale / ids.traits.size)
        ops.gemm(1.0, dlogits, "T", self._h, "N", 1.0, self.lm_head.grad, ndim=2)
        cdef Tensor dx = ws["dx"], other = ws["dx_other"]
        # StarPU orders the reuse of dx_other after ln_f has read it (data dependencies).
        ops.gemm(1.0, dlogits, "N", self.lm_head.compute, "N", 0.0, other)
        self.ln_f.backward(other, dx, 0.0)
        if self.free_activations:
            self._drop([self.ln_f], _HEAD_BUFFERS)
        for i in reversed(range(len(self.blocks))):
            self._prioritize(i + 1)
            (<Block> self.blocks[i]).backward(dx, other)
            if self.free_activations:  # block i's output was read by block i+1's backward
                self._drop([self.blocks[i]], ())
            dx, other = other, dx
        self.wte.backward(dx)
        self.wpe.backward(dx)
        if self.free_activations:
            self._drop([], _STREAM_BUFFERS, scratch=True)
        self._prioritize(0)

    def free_buffers(self):
        """Drop what the last forward kept for backward (activations, logits, the loss's
        statistics, backward's scratch), e.g. after an evaluation loss that no backward will
        read: past GPU memory StarPU would otherwise write them back to host memory. The
        positions stay; ``backward`` then needs a new ``loss``."""
        self._ready_for_backward = False
        if self._ws is not None:
            self._drop(self.blocks + [self.ln_f], _HEAD_BUFFERS + _STREAM_BUFFERS, scratch=True)

    cdef _drop(self, list modules, tuple names, bint scratch=False):
        """Invalidate the buffers of ``modules``, the model's buffers ``names`` of the last
        forward and, with ``scratch``, backward's scratch (Tensor.invalidate)."""
        for module in modules:
            (<Module> module).free_buffers()
        for name in names:
            (<Tensor> self._ws[name]).invalidate()
        if scratch:
            for tensor in self._scratch.values():
                (<Tensor> tensor).invalidate()

    def unregister(self):
        if self.loss_value is not None:
            self.loss_value.unregister()
        Module.unregister(self)
