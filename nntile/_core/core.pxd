# Typed classes of the core module, for other Cython modules (layers, models) to cimport.
from nntile._core.starpu cimport starpu_data_handle_t, starpu_data_access_mode

cdef class TensorTraits:
    cdef readonly tuple shape
    cdef readonly tuple basetile
    cdef readonly tuple grid
    cdef readonly Py_ssize_t ndim
    cdef readonly Py_ssize_t size
    cdef readonly Py_ssize_t ntiles
    cdef Py_ssize_t[16] _shape
    cdef Py_ssize_t[16] _basetile
    cdef Py_ssize_t[16] _grid
    cdef Py_ssize_t[16] _grid_stride
    cdef void tile_coords(self, Py_ssize_t linear, Py_ssize_t *coords) noexcept
    cdef Py_ssize_t tile_linear(self, const Py_ssize_t *coords) noexcept
    cdef Py_ssize_t tile_dim(self, Py_ssize_t axis, Py_ssize_t coord) noexcept
    cdef Py_ssize_t tile_nelems_c(self, const Py_ssize_t *coords) noexcept

cdef class Tensor:
    cdef readonly TensorTraits traits
    cdef readonly str dtype
    cdef int dtype_id
    cdef Py_ssize_t itemsize
    cdef starpu_data_handle_t *handles
    cdef long epoch
    cdef bint registered
    cdef bint closed_by_shutdown
    cdef readonly object owners  # rank of each tile under StarPU-MPI, else None
    cdef object __weakref__
    cdef int check_usable(self, str role) except -1
    cdef starpu_data_handle_t handle(self, Py_ssize_t linear) noexcept
