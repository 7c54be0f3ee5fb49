# cython: language_level=3
"""The causal language model, written once for every family: embeddings -> blocks -> final
norm -> head -> loss, on tiled tensors.

A family (models/gpt2.pyx, models/llama.pyx) subclasses ``CausalLM`` with data and its
embeddings:

* ``config_type``: its config class (nntile.models.config), which gives the sizes, the
  tiling rules and the name map to transformers' state dict;
* ``block_type``: its transformer block, built as ``block_type(config, tiles, dtype)`` under
  the name ``f"{block_prefix}.{i}"`` (``_build_block``, which a family overrides to hand its
  blocks a module of the model they share); ``forward(x, positions) -> out`` and
  ``backward(dy, dx)`` on the residual stream (master dtype, [batch, seq, hidden]);
  ``positions`` is the int64 [batch, seq] tensor of token positions; with ``recompute``,
  ``share_buffers(pool_as)`` puts all its buffers but the output in the model's pool
  (PreNormBlock's);
* ``norm_type``: its final norm, built as ``norm_type(hidden, hidden_tile, norm_eps, dtype)``
  under ``norm_name``; ``forward(x) -> y`` (compute dtype) and ``backward(dy, dx, beta)``;
* ``_build_embeddings``, ``_embed``, ``_embed_backward``: its embeddings, which write the
  residual stream from the token ids (and positions), and their backward.

The head is the token embedding's weight in a tied model, else ``lm_head.weight`` [vocab,
hidden]. Parameter names are those of the family's name map, which the model checks at
construction; ``state_dict``, ``load_state_dict``, ``gradients``, ``from_transformers`` and
``to_transformers`` go through it.
"""
import numpy as np

from nntile._core.core cimport Tensor
from nntile import ops
from nntile.declare import TensorSpec
from nntile.models.config import TILING_KEYS
from nntile.nn.layers cimport Embedding, Module, Parameter
from nntile.precision import PRECISIONS


# The model's own buffers that backward reads for the last time once the final norm's
# backward is submitted, and once the embeddings' is (the positions are written once and kept).
_HEAD_BUFFERS = ("logits", "loss/stats", "loss/lse", "loss/picked")
_STREAM_BUFFERS = ("x0", "dx", "dx_other")


cdef Tensor _take_spare(dict ws, str name):
    """ws[name]'s spare, swapped in: the step before may still read ws[name] (the embeddings'
    and the loss's backward, at the end of its backward), and a write into it would wait for
    that, holding the next step's submission until the last one's backward is done. Into
    the spare, which only the step before that read, the next step is submitted while the
    last one's update runs."""
    ws[name], ws[name + "/spare"] = ws[name + "/spare"], ws[name]
    return ws[name]


cdef class CausalLM(Module):
    """A causal language model over tiles (subclassed by each family, see the module).

    ``tiling`` gives tile sizes for keys batch, seq, embd, head (query heads per tile; under
    grouped-query attention a multiple of the group, the key/value tile being that divided
    by the group), inner (MLP) and vocab; a missing key means one tile for that dimension
    (the vocabulary: tiles of 8192 where it is larger, CausalLMConfig.sizes). Batch and seq
    tiles are clipped to the data's shape, so any [batch, seq] with seq <= the model's
    positions can be used; without a batch tile, ``batch_count`` cuts any batch into that many
    tiles. The tiles nntile.policy picks for a machine are the caller's to pass
    (nntile.cli_common.default_tiles). ``dtype`` is a precision (nntile.precision): fp32, tf32, fp64,
    bf16 or bf16-mixed.

    ``create=False`` builds the layers and their declarations only, and no tensor: what
    ``tensor_specs`` (and nntile.memory) read before StarPU starts.

    ``recompute``: activation recomputation, of every block (True) or of the first
    ``recompute`` blocks (CausalLMConfig.recomputed_blocks; the attribute holds that number).
    Forward keeps only the residual stream between those blocks (each block's input and
    output) and drops the rest of what such a block keeps as soon as the block's forward is
    submitted; backward runs the block's forward again on its kept input just before its
    backward, up to what that backward reads (PreNormBlock.recompute: not the MLP's output
    projection). Their other buffers are then one set that each of them overwrites in turn
    (Module.share_buffers): activations take the stream of every block, the inner
    activations of one recomputed block and those of the others, at the cost of most of a
    second forward of the recomputed blocks (fewer of them: less arithmetic, more memory). StarPU
    orders a block's rewrite after the reads of the block before (data dependencies), so
    backward sees the same values, and gradients are the same bit for bit where the kernels
    are deterministic.
    """
    config_type = None
    block_type = None
    norm_type = None
    block_prefix = None
    norm_name = None

    def __init__(self, config, tiling=None, str dtype="fp32", bint create=True,
                 recompute=False):
        name = type(self).__name__
        if dtype not in PRECISIONS:
            raise ValueError(f"{name}: dtype {dtype!r}; use {', '.join(PRECISIONS)}")
        if not isinstance(config, self.config_type):
            raise TypeError(f"{name} needs a {self.config_type.__name__}, got "
                            f"{type(config).__name__}")
        if self.block_type is None or self.norm_type is None:
            raise NotImplementedError(f"{name}: the {config.name} block is not implemented yet")
        super().__init__(dtype)
        self.config = config
        self.tiles = self.check_tiling(tiling or {}, config)
        self.batch_count = self.tiles.pop("batch_count")
        cdef dict t = self.tiles
        cdef int E = config.hidden_size
        self.embedding = self._build_embeddings()
        self.blocks = [self.add_child(f"{self.block_prefix}.{i}", self._build_block())
                       for i in range(config.num_hidden_layers)]
        self.recompute = config.recomputed_blocks(recompute)
        for block in self.blocks[:self.recompute]:  # one set of inner buffers, named for all
            block.share_buffers(f"{self.block_prefix}.*.")
        self.norm = self.add_child(self.norm_name, self.norm_type(E, t["embd"], config.norm_eps,
                                                                  dtype))
        if config.tie_word_embeddings:
            self.lm_head = self.embedding.weight
        else:
            self.lm_head = self.add_param("lm_head.weight", (config.vocab_size, E),
                                          (t["vocab"], t["embd"]), gemm=True)
        self._first_positions = {}
        self.name_map = config.name_map()
        self._check_name_map()
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

    def _check_name_map(self):
        """Every parameter of the name map is one of ours, of the same shape: what a family's
        layers name otherwise fails here, not in a conversion."""
        ours = {name: (<Parameter> p).specs[0].shape for name, p in self.named_parameters()}
        for param, shape in self.name_map.params().items():
            if param not in ours:
                raise RuntimeError(f"{type(self).__name__} has no parameter {param}, which its "
                                   "name map lists")
            if ours[param] != shape:
                raise RuntimeError(f"{type(self).__name__}: {param} has shape {ours[param]}, "
                                   f"its name map says {shape}")

    def named_parameters(self, prefix=""):
        """The parameters in the order the forward pass reads them: the embeddings, the
        blocks, the final norm, then the head (an untied one, the model's own parameter).
        The optimizer updates them in this order, and those on CPU workers come from its end
        (nntile.optim.last_share)."""
        cdef str name
        for name, child in self._children.items():
            yield from (<Module> child).named_parameters(f"{prefix}{name}.")
        for name, param in self._params.items():
            yield prefix + name, param

    def create(self, Module sharing=None):
        """Create the parameters' tensors (``sharing``: see Module.create) and the loss."""
        Module.create(self, sharing)
        self.loss_value = self._loss_spec.create()

    @staticmethod
    def check_tiling(tiling, config):
        """Tile sizes for every key: given ones checked against the config's sizes and its
        rules (config.check_tiles), the others the config's defaults. The tiles chosen for a
        machine are the caller's to give (nntile.policy.tiles, through the programs'
        default_tiles)."""
        unknown = set(tiling) - set(TILING_KEYS) - {"batch_count"}
        if unknown:
            raise ValueError(f"tiling: unknown keys {sorted(unknown)}; use {list(TILING_KEYS)}")
        sizes = {key: size for key, (size, _) in config.sizes().items()}
        defaults = {key: tile for key, (_, tile) in config.sizes().items()}
        # batch None: the batch in ``batch_count`` tiles of whatever size it comes in
        tiles = {"batch_count": int(tiling.get("batch_count") or 1)}
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
        config.check_tiles(tiles)
        return tiles

    # ---- the family's embeddings ----------------------------------------------------------

    cdef Embedding _build_embeddings(self):
        """Add the embeddings as children; return the token embedding (a tied head's weight)."""
        raise NotImplementedError

    cdef Module _build_block(self):
        """One block: ``block_type(config, tiles, dtype)``; a family whose blocks share a
        module of the model (Llama's rotary frequencies) passes it here."""
        return self.block_type(self.config, self.tiles, self.dtype)

    cdef Tensor _embed(self, dict ws):
        """Write the residual stream ws["x0"] from ws["ids"] (and ws["positions"])."""
        raise NotImplementedError

    cdef _embed_backward(self, Tensor dx, Tensor table_into=None):
        """Accumulate the embeddings' gradients from the stream's gradient dx; the token
        table's into ``table_into`` where given (Embedding.backward)."""
        raise NotImplementedError

    # ---- what the model holds, declared -------------------------------------------------

    cdef tuple _lead_for(self, int B, int T):
        """[batch, seq] and their tiles (clipped to the data's shape)."""
        cdef int batch_tile = self.tiles["batch"] or -(-B // self.batch_count)
        return (B, T), (min(batch_tile, B), min(self.tiles["seq"], T))

    def data_tiles(self, int batch, int seq):
        """The tiles of data [batch, seq]: (batch tile, seq tile), clipped to its shape."""
        return self._lead_for(batch, seq)[1]

    def declare(self, tuple lead, tuple tiles):
        """The tensors of a [batch, seq] shape of the data: token ids and targets (each twice:
        _take_spare), positions, the residual stream x0 and its gradient (ping-pong with
        dx_other), the logits and the loss's statistics. The stream and the statistics are
        in the master dtype, the logits (a GEMM's output) in the compute dtype."""
        cdef tuple x = lead + (self.config.hidden_size,), x_tiles = tiles + (self.tiles["embd"],)
        return [*(self.buffer_spec(name, lead, tiles, "int64", "workspaces")
                  for name in ("ids", "labels", "ids/spare", "labels/spare")),
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
        P = self.config.max_position_embeddings
        if not 1 <= seq <= P or batch < 1:
            raise ValueError(f"[batch, seq] = [{batch}, {seq}]: need batch >= 1 and "
                             f"1 <= seq <= {self.config.field_name('max_position_embeddings')} "
                             f"({P})")
        return self.declaration(*self._lead_for(batch, seq), training)

    @property
    def dtype_name(self):
        return self.dtype

    # ---- parameters in transformers' layout, through the name map -------------------------

    def _mapped_parameters(self):
        """{name: Parameter}, once every parameter is known to the name map."""
        params = dict(self.named_parameters())
        extra = sorted(set(params) - set(self.name_map.params()))
        if extra:
            raise ValueError(f"{type(self).__name__}: parameter {extra[0]} has no place in "
                             f"transformers' {self.config.name} state dict (the name map)")
        return params

    def load_state_dict(self, state):
        """Load numpy arrays keyed by transformers' names (into the master weights, and their
        compute copies); every tensor is checked before any is written."""
        params = self._mapped_parameters()
        for name, array in self.name_map.to_ours(state):
            (<Parameter> params[name]).write(array)

    def _collect(self, str which):
        params = self._mapped_parameters()
        return self.name_map.to_hf(lambda name: getattr(params[name], which).to_array())

    def state_dict(self):
        """Parameters (the master weights) as numpy arrays keyed by transformers' names."""
        return self._collect("value")

    def gradients(self):
        """Gradients as numpy arrays keyed by transformers' names."""
        return self._collect("grad")

    def init_weights(self, seed):
        """The family's initialisation (config.initial), from a seeded numpy Generator."""
        params = dict(self.named_parameters())
        shapes = [(name, (<Parameter> p).specs[0].shape) for name, p in params.items()]
        for name, array in self.config.init_weights(shapes, seed):
            (<Parameter> params[name]).write(array)

    @classmethod
    def from_transformers(cls, hf_model, tiling=None, dtype="fp32"):
        """A model holding the weights of a transformers model of this family."""
        import torch
        model = cls(cls.config_type.from_transformers(hf_model.config), tiling, dtype)
        state = {}
        for name, tensor in hf_model.state_dict().items():
            tensor = tensor.detach().cpu()
            if tensor.dtype in (torch.bfloat16, torch.float16):  # numpy has no bfloat16
                tensor = tensor.float()
            state[name] = tensor.numpy()
        model.load_state_dict(state)
        return model

    def to_transformers(self):
        """A transformers model of this family holding a copy of the weights (fp64 for an
        fp64 model, else fp32)."""
        import torch
        import transformers
        hf = transformers.AutoModelForCausalLM.from_config(self.config.to_transformers())
        hf = hf.to(torch.float64 if self.dtype == "fp64" else torch.float32)
        state = self.state_dict()
        with torch.no_grad():
            for name, tensor in hf.state_dict().items():
                if name in state:
                    tensor.copy_(torch.from_numpy(state[name]))
        return hf

    # ---- forward, loss, backward ---------------------------------------------------------

    def _check_tokens(self, array, str what):
        array = np.asarray(array)
        P = self.config.max_position_embeddings
        if array.ndim != 2:
            raise ValueError(f"{what} must be [batch, seq], got shape {array.shape}")
        if array.shape[0] == 0:
            raise ValueError(f"{what} has shape {array.shape}: the batch is empty")
        if not 1 <= array.shape[1] <= P:
            raise ValueError(f"{what} has shape {array.shape}: the sequence length must be "
                             f"between 1 and "
                             f"{self.config.field_name('max_position_embeddings')}={P}")
        if array.dtype.kind not in "iu":
            raise TypeError(f"{what} must hold integers, got {array.dtype}")
        if array.min() < 0 or array.max() >= self.config.vocab_size:
            bad = array[(array < 0) | (array >= self.config.vocab_size)][0]
            raise ValueError(f"{what} holds token id {bad}, outside the vocabulary "
                             f"[0, {self.config.vocab_size})")
        return array

    def _check_positions(self, ids, int start):
        P = self.config.max_position_embeddings
        if start < 0 or start + ids.shape[1] > P:
            raise ValueError(f"tokens at positions {start} to {start + ids.shape[1] - 1} do not "
                             f"fit in {self.config.field_name('max_position_embeddings')}={P}")

    cdef dict _workspace(self, int B, int T, int start):
        """The model's buffers for [batch, seq] = [B, T], the positions start, start + 1, ...
        (written again only where they change)."""
        lead = self._lead_for(B, T)
        cdef dict ws = self._buffers_for(lead)
        if self._first_positions.get(lead) != start:
            ws["positions"].write(np.broadcast_to(np.arange(start, start + T), (B, T)))
            self._first_positions[lead] = start
        return ws

    cdef _prioritize(self, int distance):
        """With ``layer_priorities``, tasks submitted next get their distance from the end of
        the step as priority (forward of block i: 2L+2-i, loss: L+2, backward of block i:
        i+1, the optimizer after it: 0), so that where several tasks are ready the scheduler
        runs the one on the critical path, and fetches its tiles, first."""
        if self.layer_priorities:
            ops.set_task_priority(distance)

    cdef Tensor _forward(self, input_ids, int start=0, bint head=True):
        for _ in self._forward_steps(input_ids, start, head):
            pass
        return self._ws["logits"] if head else None

    def _forward_steps(self, input_ids, int start=0, bint head=True):
        """Submit forward up to the logits (``head``: else the blocks only), yielding after
        the embeddings and after each block (see ``submit_loss_steps``)."""
        if self.loss_value is None:
            raise RuntimeError(f"{type(self).__name__}(create=False) declares its tensors but "
                               "holds none; call create() before running it")
        ids = self._check_tokens(input_ids, "input_ids")
        cdef dict ws = self._workspace(ids.shape[0], ids.shape[1], start)
        self._ws = ws
        _take_spare(ws, "ids").write(ids)
        cdef int L = len(self.blocks), i
        self._prioritize(2 * L + 3)
        cdef Tensor x = self._embed(ws), positions = ws["positions"]
        self._inputs = []
        yield
        for i in range(L):
            self._prioritize(2 * L + 2 - i)
            self._inputs.append(x)
            x = self.blocks[i].forward(x, positions)
            if i < self.recompute:  # backward runs the block again from its input
                self._drop([self.blocks[i]], (), False, x)
            yield
        if not head:
            return
        self._prioritize(L + 2)
        self._h = self.norm.forward(x)
        ops.gemm(1.0, self._h, "N", self.lm_head.compute, "T", 0.0, ws["logits"])

    def forward(self, input_ids, int start=0, bint head=True):
        """Logits [batch, seq, vocab] as a numpy array. ``start``: the position of the first
        token (the tokens a key/value cache holds before these; nntile.models.kv_cache).
        ``head=False``: the blocks only, and nothing returned (a prompt filling a cache)."""
        self._ready_for_backward = False
        if start:  # from position 0, _check_tokens says what does not fit
            self._check_positions(self._check_tokens(input_ids, "input_ids"), start)
        logits = self._forward(input_ids, start, head)
        self._prioritize(0)
        return logits.to_array() if head else None

    def generate(self, input_ids, max_new_tokens, **sampling):
        """The prompts ``input_ids`` [batch, seq] continued by up to ``max_new_tokens`` tokens
        each, with a key/value cache: nntile.models.kv_cache.generate says what ``sampling``
        takes and what comes back."""
        from nntile.models.kv_cache import generate
        return generate(self, input_ids, max_new_tokens, **sampling)

    def loss(self, input_ids, targets):
        """Mean cross-entropy of next-token targets (already shifted) as a float; activations
        are kept for ``backward``."""
        self.submit_loss(input_ids, targets)
        return float(self.loss_value.to_array()[0])

    def submit_loss(self, input_ids, targets):
        """Submit forward and loss without waiting; the loss lands in ``loss_value``."""
        for _ in self.submit_loss_steps(input_ids, targets):
            pass

    def submit_loss_steps(self, input_ids, targets):
        """``submit_loss`` in pieces: a generator that submits up to each block's end and
        yields, so that replicas of the model on several devices of one process take turns
        (nntile.parallel) and every device gets work from the start of the step."""
        input_ids = self._check_tokens(input_ids, "input_ids")
        targets = self._check_tokens(targets, "targets")
        if targets.shape != input_ids.shape:
            raise ValueError(f"targets have shape {targets.shape} but input_ids {input_ids.shape}")
        yield from self._forward_steps(input_ids)
        cdef dict ws = self._ws
        _take_spare(ws, "labels").write(targets)
        ops.cross_entropy(ws["logits"], ws["labels"], ws["loss/stats"], ws["loss/lse"],
                          ws["loss/picked"], self.loss_value, 1.0 / input_ids.size)
        self._prioritize(0)
        self._ready_for_backward = True

    def backward(self, double scale=1.0):
        """Accumulate every parameter's gradient of the last loss, times ``scale`` (for
        gradient accumulation over micro-batches, pass 1/number of micro-batches)."""
        for _ in self.backward_steps(scale):
            pass

    def backward_steps(self, double scale=1.0, Tensor table_into=None):
        """``backward`` in pieces: a generator that yields, after the head and after each
        block, the parameters whose gradients it has then submitted in full (the head's and
        final norm's, each block's, and last the embeddings', with a tied head), so that
        replicas on several devices take turns and their sums start early (nntile.parallel).

        ``table_into``: a tensor tiled as the token table's gradient into which the lookup
        adds its part instead (the replicas' sum, nntile.parallel.DeviceReplicas); no piece
        then hands over the table. With a tied head, the head's piece hands over the tied
        parameter, its gradient complete once the head's GEMM is submitted: its sum, the
        largest, runs beside the blocks' backward instead of after the lookup's, at the end of
        backward."""
        if not self._ready_for_backward:
            raise RuntimeError("backward() needs a loss() first (forward() alone keeps no loss)")
        self._ready_for_backward = False
        cdef dict ws = self._ws
        cdef Tensor dlogits = ws["logits"], ids = ws["ids"]
        cdef int i
        cdef bint apart = table_into is not None
        # the head's gradient is whole after its GEMM unless the lookup still adds into it
        cdef bint head_whole = apart or not self.config.tie_word_embeddings
        self._prioritize(len(self.blocks) + 1)
        ops.cross_entropy_backward(dlogits, ws["labels"], ws["loss/stats"],
                                   scale / ids.traits.size)
        ops.gemm(1.0, dlogits, "T", self._h, "N", 1.0, self.lm_head.grad, ndim=2)
        cdef Tensor dx = ws["dx"], other = ws["dx_other"]
        # StarPU orders the reuse of dx_other after the norm has read it (data dependencies).
        ops.gemm(1.0, dlogits, "N", self.lm_head.compute, "N", 0.0, other)
        self.norm.backward(other, dx, 0.0)
        if self.free_activations:
            self._drop([self.norm], _HEAD_BUFFERS)
        head = [self.lm_head] if head_whole else []
        yield [p for _, p in self.norm.named_parameters()] + head
        for i in reversed(range(len(self.blocks))):
            self._prioritize(i + 1)
            if i < self.recompute:  # its buffers again, once block i+1's backward read them
                self.blocks[i].recompute(self._inputs[i], ws["positions"])
            self.blocks[i].backward(dx, other)
            if self.free_activations:  # block i's output was read by block i+1's backward
                self._drop([self.blocks[i]], ())
            dx, other = other, dx
            yield [p for _, p in self.blocks[i].named_parameters()]
        self._embed_backward(dx, table_into)
        if self.free_activations:
            self._drop([], _STREAM_BUFFERS, scratch=True)
        self._prioritize(0)
        cdef Parameter table = self.embedding.weight
        yield [p for _, p in self.embedding_parameters()
               if not (head_whole and p is self.lm_head) and not (apart and p is table)]

    def embedding_parameters(self):
        """(name, parameter) of the embeddings: every parameter no block, final norm or
        untied head holds."""
        others = {id(p) for m in self.blocks + [self.norm] for _, p in m.named_parameters()}
        if not self.config.tie_word_embeddings:
            others.add(id(self.lm_head))
        for name, param in self.named_parameters():
            if id(param) not in others:
                yield name, param

    def free_buffers(self):
        """Drop what the last forward kept for backward (activations, logits, the loss's
        statistics, backward's scratch), e.g. after an evaluation loss that no backward will
        read: past GPU memory StarPU would otherwise write them back to host memory. The
        positions stay; ``backward`` then needs a new ``loss``."""
        self._ready_for_backward = False
        if self._ws is not None:
            self._drop(self.blocks + [self.norm], _HEAD_BUFFERS + _STREAM_BUFFERS, scratch=True)

    cdef _drop(self, list modules, tuple names, bint scratch=False, Tensor keep=None):
        """Invalidate the buffers of ``modules`` but ``keep``, the model's buffers ``names``
        of the last forward and, with ``scratch``, backward's scratch (Tensor.invalidate)."""
        for module in modules:
            (<Module> module).free_buffers(keep)
        for name in names:
            (<Tensor> self._ws[name]).invalidate()
        if scratch:
            for tensor in self._scratch.values():
                (<Tensor> tensor).invalidate()

    def unregister(self):
        if self.loss_value is not None:
            self.loss_value.unregister()
        Module.unregister(self)
