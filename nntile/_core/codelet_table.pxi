# The op enum and codelet table of codelets.h.
cdef extern from "codelets.h" nogil:
    enum nntile_op:
        NNTILE_OP_fill
        NNTILE_OP_copy
        NNTILE_OP_subcopy
        NNTILE_OP_add
        NNTILE_OP_scal
        NNTILE_OP_prod
        NNTILE_OP_gelu
        NNTILE_OP_gelu_backward
        NNTILE_OP_gelutanh
        NNTILE_OP_gelutanh_backward
        NNTILE_OP_add_fiber
        NNTILE_OP_prod_fiber
        NNTILE_OP_sum_fiber
        NNTILE_OP_sumprod_fiber
        NNTILE_OP_sum_slice
        NNTILE_OP_sumprod_slice
        NNTILE_OP_add_slice
        NNTILE_OP_prod_slice
        NNTILE_OP_maxsumexp
        NNTILE_OP_softmax_inplace
        NNTILE_OP_softmax_backward
        NNTILE_OP_mask_causal
        NNTILE_OP_logsumexp
        NNTILE_OP_xent_picked
        NNTILE_OP_xent_loss
        NNTILE_OP_xent_grad_inplace
        NNTILE_OP_embedding
        NNTILE_OP_embedding_backward
        NNTILE_OP_layernorm_stats
        NNTILE_OP_layernorm_forward
        NNTILE_OP_layernorm_backward_reduce
        NNTILE_OP_layernorm_backward
        NNTILE_OP_gemm
        NNTILE_OP_sumsq
        NNTILE_OP_adam_step
        NNTILE_OP_sgd_step
        NNTILE_OP_cast
        NNTILE_OP_adam_step_refresh
        NNTILE_OP_COUNT
    starpu_codelet *nntile_codelet(int op, int dtype)
    const char *nntile_op_name(int op)
