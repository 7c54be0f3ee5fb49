# The attention mask as Python holds it: AttentionMask, one value that every attention op
# takes, built on the C struct of kernels.h (nntile_mask) and checked by that header's
# nntile_mask_error. No field is named here but causal (the default) and offset (``at``):
# the others reach the kernels from a config without the core knowing them.
import operator

from libc.stdint cimport int64_t
from libc.string cimport memset
from nntile._core.kernel_args cimport nntile_mask, nntile_range


cdef extern from "kernels/kernels.h" nogil:
    nntile_range nntile_mask_keys(nntile_mask m, int64_t q0, int64_t q1, int64_t nk)
    bint nntile_mask_whole(nntile_mask m, int64_t q0, int64_t q1, int64_t k0, int64_t k1)
    const char *nntile_mask_error(nntile_mask m)


cdef class AttentionMask:
    """Which keys each query of attention sees: the fields of kernels.h's ``nntile_mask``
    (``causal``, a query sees no key after its own position, by default; ``offset``, the key
    position of query 0; and the others the header declares), 0 where not given. Immutable;
    checked by the header's rules when made (ValueError), so an op never gets a bad one.
    ``at(offset)`` is the same mask with another offset (a key/value cache's length)."""
    cdef nntile_mask m

    def __init__(self, causal=True, **fields):
        cdef nntile_mask zero
        memset(&zero, 0, sizeof(zero))
        cdef dict zeros = zero  # every field of the struct, in its order: 0 or 0.0
        cdef dict values = dict(zeros, causal=causal)
        for name, value in fields.items():
            if name not in values:
                raise TypeError(f"AttentionMask: no field {name!r}; the fields are "
                                f"{', '.join(values)} (kernels.h, nntile_mask)")
            values[name] = value
        for name, value in values.items():
            kind = type(zeros[name])
            try:
                values[name] = operator.index(value) if kind is int else kind(value)
            except (TypeError, ValueError):
                raise ValueError(f"AttentionMask: {name} must be {kind.__name__}, "
                                 f"got {value!r}") from None
        self.m = values
        cdef const char *error = nntile_mask_error(self.m)
        if error != NULL:
            raise ValueError(f"AttentionMask: {error.decode()}, got {self!r}")

    @property
    def fields(self):
        """{field: value} in the order of kernels.h's struct (a new dict each time)."""
        return <dict> self.m

    def __getattr__(self, name):
        fields = self.fields
        if name in fields:
            return fields[name]
        raise AttributeError(f"AttentionMask has no field {name!r}")

    def at(self, offset):
        """This mask with query 0 at key position ``offset``."""
        return AttentionMask(**dict(self.fields, offset=offset))

    def key_tiles(self, q0, q1, nk, tile):
        """The key tiles (of ``tile`` keys, among ``nk`` keys) that some query of [q0, q1)
        sees: the tiles the attention ops submit tasks for."""
        return range(*_key_tiles(self.m, q0, q1, nk, tile))

    def whole(self, q0, q1, k0, k1):
        """Every key of [k0, k1) is visible from every query of [q0, q1): no mask to apply."""
        return nntile_mask_whole(self.m, q0, q1, k0, k1)

    def __eq__(self, other):
        if not isinstance(other, AttentionMask):
            return NotImplemented
        return self.fields == other.fields

    def __hash__(self):
        return hash(tuple(self.fields.items()))

    def __repr__(self):
        return "AttentionMask(" + ", ".join(f"{k}={v}" for k, v in self.fields.items()) + ")"

    def __reduce__(self):
        return _mask_of, (self.fields,)


def _mask_of(fields):
    """The AttentionMask of ``fields`` (what unpickling calls)."""
    return AttentionMask(**fields)


cdef (Py_ssize_t, Py_ssize_t) _key_tiles(nntile_mask m, Py_ssize_t q0, Py_ssize_t q1,
                                         Py_ssize_t nk, Py_ssize_t tile):
    """The key tiles [first, end) of size ``tile`` (of nk keys) that queries [q0, q1) see."""
    cdef nntile_range r = nntile_mask_keys(m, q0, q1, nk)
    if r.hi <= r.lo:
        return 0, 0
    return r.lo // tile, (r.hi + tile - 1) // tile


_CAUSAL = AttentionMask()  # the ops' default
