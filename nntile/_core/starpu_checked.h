/* The StarPU functions nntile calls whose return code matters, declared once more with
 * warn_unused_result. The core module is compiled with -Werror=unused-result, so a call whose
 * code is dropped (even cast to void) does not build: every one goes through CHKERR
 * (runtime.pxi). nntile's own StarPU-MPI calls are marked so in mpi_glue.h.
 * tests/test_policy.py checks that every int-returning function of starpu.pxd is either here
 * or named there as returning a value rather than an error code. */
#ifndef NNTILE_STARPU_CHECKED_H
#define NNTILE_STARPU_CHECKED_H

#include <starpu.h>
#include <starpu_profiling.h>

#define NNTILE_CHECKED __attribute__((warn_unused_result))

int starpu_conf_init(struct starpu_conf *conf) NNTILE_CHECKED;
int starpu_init(struct starpu_conf *conf) NNTILE_CHECKED;
int starpu_task_submit(struct starpu_task *task) NNTILE_CHECKED;
int starpu_task_insert(struct starpu_codelet *cl, ...) NNTILE_CHECKED;
int starpu_task_wait_for_all(void) NNTILE_CHECKED;
int starpu_data_acquire(starpu_data_handle_t handle, enum starpu_data_access_mode mode) NNTILE_CHECKED;
int starpu_profiling_status_set(int status) NNTILE_CHECKED;
int starpu_profiling_worker_get_info(int workerid, struct starpu_profiling_worker_info *worker_info) NNTILE_CHECKED;
int starpu_bus_get_profiling_info(int busid, struct starpu_profiling_bus_info *bus_info) NNTILE_CHECKED;

#endif
