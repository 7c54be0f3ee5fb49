# The base of every layer, for the layers and models that cimport it.
from nntile._core.core cimport Tensor


cdef class Parameter:
    cdef readonly list specs
    cdef readonly Tensor value
    cdef readonly Tensor grad
    cdef readonly Tensor copy
    cdef readonly Tensor compute
    cdef Tensor _new_grad(self)


cdef class Module:
    cdef dict _params
    cdef dict _children
    cdef dict _scratch
    cdef dict _constants
    cdef dict _declared
    cdef dict _buffers
    cdef tuple _lead
    cdef str _pool_as
    cdef tuple _own
    cdef readonly str dtype
    cdef readonly str master
    cdef readonly str compute
    cpdef Parameter add_param(self, str name, tuple shape, tuple basetile, bint gemm=*)
    cpdef Module add_child(self, str name, Module module)
    cpdef dict buffers(self, Tensor x)
    cpdef dict scratch(self)
    cdef dict _buffers_for(self, tuple lead)
    cdef list _declared_for(self, tuple lead)
    cdef object _pooled(self, spec)
    cdef Tensor _from_pool(self, spec)
    cdef _use_scratch(self, dict pool)
