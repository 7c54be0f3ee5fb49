# cython: language_level=3
"""The base of every layer: a ``Module`` holds named parameters (``Parameter``: value,
gradient and, under bf16-mixed, the compute copy), sub-modules, constants, and the buffers and
scratch it declares (nntile.declare.TensorSpec), creating its tensors from those declarations
only."""
import numpy as np

from nntile._core.core cimport Tensor
from nntile import ops
from nntile.declare import TensorSpec
from nntile.precision import precision_dtypes

cdef class Parameter:
    """A trainable tensor and its gradient (same shape and tiling), both starting at zero.

    ``value`` and ``grad`` are in the master dtype. A GEMM operand whose compute dtype differs
    (bf16-mixed) also has ``copy``, the value in the compute dtype, which the GEMMs read;
    ``compute`` is the tensor GEMMs read: ``copy``, or ``value`` itself. ``specs`` declares
    them (value first); they exist once ``create`` has run.
    """

    def __init__(self, str name, tuple shape, tuple basetile, str master, str compute,
                 bint gemm=False):
        self.specs = [TensorSpec(name, shape, basetile, master, "parameters"),
                      TensorSpec(name + "/grad", shape, basetile, master, "gradients")]
        if gemm and compute != master:
            self.specs.append(TensorSpec(name + "/copy", shape, basetile, compute,
                                         "compute_copies"))

    def create(self):
        """Create value, gradient and copy from ``specs``."""
        self.value = self.specs[0].create()
        self.grad = self._new_grad()
        self.copy = self.specs[2].create() if len(self.specs) == 3 else None
        self.compute = self.value if self.copy is None else self.copy

    cdef Tensor _new_grad(self):
        """The gradient, zero. Where this process holds every tile (no StarPU-MPI owners), its
        tiles read as zeros once dropped and start so: zero_grad then drops them (no fill,
        no memory between steps), and backward's first GEMM into a tile overwrites it."""
        cdef Tensor grad = self.specs[1].create(zero=False)
        if grad.owners is None:
            grad.zero_when_dropped()
        grad.clear()
        return grad

    def share(self, Parameter other):
        """Hold ``other``'s value and compute copy, and a gradient of its own (created from
        ``specs``): a replica of a model on another device of the same process, whose
        gradients are summed into ``other``'s after backward (nntile.parallel)."""
        if other.specs[0].shape != self.specs[0].shape or len(other.specs) != len(self.specs):
            raise ValueError(f"parameter {self.specs[0].name} cannot share "
                             f"{other.specs[0].name}: their declarations differ")
        self.value, self.copy, self.compute = other.value, other.copy, other.compute
        self.grad = self._new_grad()

    def refresh(self):
        """Bring the compute copy up to date with the value (one task per tile); to be
        called after writing the value directly (optimizers refresh it themselves)."""
        if self.copy is not None:
            ops.cast(self.value, self.copy)

    def write(self, array):
        """Write the value from a numpy array, and refresh the compute copy."""
        self.value.write(array)
        self.refresh()

    def unregister(self):
        for tensor in (self.value, self.grad, self.copy):
            if tensor is not None:
                tensor.unregister()


cdef class Module:
    """Named parameters and sub-modules; names follow transformers' GPT-2 where they can."""

    def __init__(self, str dtype):
        try:
            self.master, self.compute = precision_dtypes(dtype)
        except ValueError as exc:
            raise ValueError(f"layers: {exc}") from None
        self.dtype = dtype
        self._params = {}
        self._children = {}
        self._declared = {}   # input [batch, seq] and tiles -> what declare() lists for it
        self._buffers = {}    # input [batch, seq] and tiles -> {name: buffer}
        self._scratch = {}    # shared_key -> tensor, one pool for the whole model
        self._constants = {}  # name -> [TensorSpec, values, tensor once created]
        self._lead = None     # the input [batch, seq] and tiles of the last forward
        self._pool_as = None  # share_buffers: the name of this module's buffers in the pool
        self._own = ()        # share_buffers: the buffers this module keeps its own

    cpdef Parameter add_param(self, str name, tuple shape, tuple basetile, bint gemm=False):
        """Declare a parameter (``create`` makes its tensors); ``gemm``: GEMMs read it (it
        gets a copy in the compute dtype where that differs from the master dtype)."""
        cdef Parameter param = Parameter(name, shape, basetile, self.master, self.compute, gemm)
        self._params[name] = param
        return param

    def add_constant(self, str name, values, str dtype=None):
        """Declare a tensor computed once from the config and never trained (the inverse
        frequencies of rotary positions): one tile in ``dtype`` (the master dtype unless
        told), created and written by ``create``; no gradient, not a parameter, so neither
        optimized nor saved in checkpoints. ``constant(name)`` gives it."""
        values = np.asarray(values)
        spec = TensorSpec(name, values.shape, values.shape, dtype or self.master, "workspaces")
        self._constants[name] = [spec, values, None]

    def constant(self, str name):
        """A constant's tensor (``add_constant``), once ``create`` has run."""
        return self._constants[name][2]

    cpdef Module add_child(self, str name, Module module):
        self._children[name] = module
        module._use_scratch(self._scratch)
        return module

    cdef _use_scratch(self, dict pool):
        """Share one pool of backward temporaries (and of shared buffers, share_buffers)
        across the whole model."""
        pool.update(self._scratch)
        self._scratch = pool
        for child in self._children.values():
            (<Module> child)._use_scratch(pool)

    def named_modules(self, prefix=""):
        yield prefix, self
        for name, child in self._children.items():
            yield from (<Module> child).named_modules(f"{prefix}{name}.")

    def named_parameters(self, prefix=""):
        for name, param in self._params.items():
            yield prefix + name, param
        for name, child in self._children.items():
            yield from (<Module> child).named_parameters(f"{prefix}{name}.")

    def create(self, Module sharing=None):
        """Create the tensors of every parameter and constant of this module and its
        children; with ``sharing`` (a module built alike, already created), hold its
        parameters' values instead and create only gradients (Parameter.share)."""
        if sharing is None:
            for _, param in self.named_parameters():
                (<Parameter> param).create()
        else:
            theirs = dict(sharing.named_parameters())
            for name, param in self.named_parameters():
                if name not in theirs:
                    raise ValueError(f"cannot share parameters: {name} has no counterpart")
                (<Parameter> param).share(theirs[name])
        for _, module in self.named_modules():
            for entry in (<Module> module)._constants.values():
                entry[2] = entry[0].create()
                (<Tensor> entry[2]).write(entry[1])

    def zero_grad(self):
        for _, param in self.named_parameters():
            (<Parameter> param).grad.clear()

    def refresh_copies(self):
        """Refresh every parameter's compute copy (after writing values directly)."""
        for _, param in self.named_parameters():
            (<Parameter> param).refresh()

    # ---- what a module creates while it runs, declared ------------------------------------

    def declare(self, tuple lead, tuple tiles):
        """The tensors this module, not its children, creates while running on an input
        whose first two dims ([batch, seq]) are ``lead``, tiled ``tiles``: the buffers
        forward keeps (``buffer_spec``) and backward's scratch (``scratch_spec``). A layer
        that needs a tensor declares it here and takes it from ``buffers()`` or ``scratch()``;
        nothing else creates one."""
        return []

    def buffer_spec(self, str name, tuple shape, tuple tiles, str dtype=None,
                    str category="activations"):
        """A tensor forward creates and keeps (in the compute dtype unless told), one per
        input shape; the batch comes first, and under StarPU-MPI its tiles are shared out."""
        return TensorSpec(name, shape, tiles, dtype or self.compute, category, owners="batch")

    def scratch_spec(self, str name, tuple shape, tuple tiles, str dtype=None):
        """A temporary of backward (in the compute dtype unless told), shared by every module
        of the model under the same name, shape, tiling and dtype: layers run backward one
        after another, so layer i-1 may reuse layer i's temporaries (StarPU orders the reuse
        after the last read). Saves one set of backward temporaries per layer but one.
        Names differ between layer types ("attn.do", "linear.dy"): a layer holds its scratch
        while its children run backward, so theirs must be other tensors."""
        return TensorSpec(name, shape, tiles, dtype or self.compute, "workspaces",
                          owners="batch", shared=True)

    def share_buffers(self, str pool_as, tuple own=()):
        """Take the buffers of this module and its children, but this module's ``own``,
        from the model's pool, named ``pool_as`` + their place in this module: modules given
        the same ``pool_as`` (the blocks of a model that recomputes them) then hold one set
        between them, which each forward overwrites. StarPU orders each write after the reads
        of the module that wrote before (data dependencies), so one module's buffers are
        rewritten only once every task that reads them is done. Call it before the first
        forward."""
        for path, module in self.named_modules():
            (<Module> module)._pool_as = pool_as + path
        self._own = own

    cdef object _pooled(self, spec):
        """The pool's spec of one of this module's buffers (shared by the modules of the
        same ``share_buffers`` name), or None for a buffer of its own."""
        if self._pool_as is None or spec.shared or spec.name in self._own:
            return None
        return TensorSpec(self._pool_as + spec.name, spec.shape, spec.basetile, spec.dtype,
                          spec.category, spec.owners, shared=True)

    cdef Tensor _from_pool(self, spec):
        """The pool's tensor of a shared spec, created on first use."""
        tensor = self._scratch.get(spec.shared_key)
        if tensor is None:
            tensor = self._scratch[spec.shared_key] = spec.create()
        return tensor

    def declaration(self, lead=None, tiles=None, bint training=True):
        """The TensorSpecs of this module and its children, named by their place in it.
        Without ``lead``: what ``create`` makes (parameters, gradients, compute copies,
        constants). With
        it: what running on such an input adds, every module's buffers (those shared by
        ``share_buffers`` once, under their name in the pool) and, when ``training``,
        backward's scratch, once per shared key."""
        cdef list specs = [], scratch = []
        cdef set seen = set()
        for prefix, module in self.named_modules():
            if lead is None:
                for param in (<Module> module)._params.values():
                    specs += [s.renamed(prefix + s.name) for s in (<Parameter> param).specs]
                specs += [entry[0].renamed(prefix + entry[0].name)
                          for entry in (<Module> module)._constants.values()]
                continue
            for s in module.declare(lead, tiles):
                pooled = (<Module> module)._pooled(s)
                if pooled is not None:
                    if pooled.shared_key not in seen:
                        seen.add(pooled.shared_key)
                        scratch.append(pooled)
                elif not s.shared:
                    specs.append(s.renamed(prefix + s.name))
                elif training and s.shared_key not in seen:
                    seen.add(s.shared_key)
                    scratch.append(s.renamed("scratch." + s.name))
        return specs + scratch

    cdef list _declared_for(self, tuple lead):
        cdef list specs = self._declared.get(lead)
        if specs is None:
            specs = self._declared[lead] = list(self.declare(*lead))
        return specs

    cpdef dict buffers(self, Tensor x):
        """This module's buffers (name -> tensor) for an input like ``x``: the ones
        ``declare`` lists for its [batch, seq] shape and tiling, all created on the first
        call with that shape and reused after."""
        return self._buffers_for((x.shape[:2], x.basetile[:2]))

    cdef dict _buffers_for(self, tuple lead):
        self._lead = lead
        cdef dict tensors = self._buffers.get(lead)
        if tensors is None:
            tensors = {}
            for s in self._declared_for(lead):
                pooled = self._pooled(s)
                if pooled is not None:
                    tensors[s.name] = self._from_pool(pooled)
                elif not s.shared:
                    tensors[s.name] = s.create()
            self._buffers[lead] = tensors
        return tensors

    cpdef dict scratch(self):
        """Backward's scratch (name -> tensor) for the input of the last forward, taken from
        the model's pool (created there on first use)."""
        return {s.name: self._from_pool(s) for s in self._declared_for(self._lead) if s.shared}

    def kept_buffers(self):
        """What the last forward kept, in this module and its children: (name, tensor)."""
        for prefix, module in self.named_modules():
            lead = (<Module> module)._lead
            if lead is not None:
                for name, tensor in (<Module> module)._buffers[lead].items():
                    yield prefix + name, tensor

    def free_buffers(self, Tensor keep=None):
        """Drop what the last forward kept, in this module and its children, once the backward
        that reads it has been submitted (``Tensor.invalidate``): past GPU memory StarPU then
        frees those tiles instead of writing them back to host memory, where they would crowd
        out the weights. The next forward writes them again; a second backward cannot run.
        ``keep``: one buffer left as it is (a block's output, which the next block reads)."""
        for _, tensor in self.kept_buffers():
            if tensor is not keep:
                (<Tensor> tensor).invalidate()

    def unregister(self):
        for tensors in self._buffers.values():
            for tensor in tensors.values():
                (<Tensor> tensor).unregister()
        self._buffers.clear()
        for tensor in self._scratch.values():
            (<Tensor> tensor).unregister()
        self._scratch.clear()
        for param in self._params.values():
            (<Parameter> param).unregister()
        for entry in self._constants.values():
            if entry[2] is not None:
                (<Tensor> entry[2]).unregister()
                entry[2] = None
        for child in self._children.values():
            (<Module> child).unregister()
