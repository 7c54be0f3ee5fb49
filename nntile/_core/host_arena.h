/* Pinned host memory taken ahead of StarPU's need (host_arena.c says why). */
#ifndef NNTILE_HOST_ARENA_H
#define NNTILE_HOST_ARENA_H

#include <stddef.h>

#ifndef NNTILE_CHECKED
#define NNTILE_CHECKED __attribute__((warn_unused_result))
#endif

struct nntile_host_arena_stats {
    size_t pinned;         /* bytes in the arena's chunks */
    size_t in_use;         /* bytes of the chunks handed out now */
    size_t peak_in_use;
    size_t served;         /* allocations served from the chunks, all along */
    size_t outside;        /* allocations the chunks could not hold, pinned one by one */
    size_t refused;        /* allocations refused (-ENOMEM) so that StarPU reclaims first */
    double pin_seconds;    /* the filler's time pinning */
    double wait_seconds;   /* callers' time waiting for the filler */
};

/* Start the arena: a thread pins chunks of ``chunk`` bytes, keeping at least ``headroom``
 * bytes free ahead of use, until ``target`` bytes are pinned. ``cap`` bounds all pinned
 * memory the arena hands out, in its chunks or outside them. ``pinned`` = 0 takes plain
 * memory (tests on machines without CUDA); ``hooks`` = 1 serves StarPU's pinned host
 * allocations (starpu_malloc_set_hooks); call it after starpu_init and before any data is
 * registered. Returns 0, -EINVAL, -EBUSY (already started), -ENOSYS (pinned without CUDA),
 * or -ENOMEM. */
int nntile_host_arena_start(size_t target, size_t cap, size_t chunk, size_t headroom,
                            int pinned, int hooks) NNTILE_CHECKED;
/* Stop the filler, give StarPU back its own allocation and release all the arena pinned:
 * after starpu_shutdown (or, in tests, once every block is freed). Returns 0. */
int nntile_host_arena_stop(void) NNTILE_CHECKED;
/* Pin the rest of ``target`` now, whatever the headroom, and wait until the filler is done
 * (target reached, cap reached or no more memory); returns the seconds waited. */
double nntile_host_arena_pin_all(void);
int nntile_host_arena_running(void);
void nntile_host_arena_read_stats(struct nntile_host_arena_stats *stats);
/* The allocator itself, as the hooks call it (for tests): 0 and *ptr, or -ENOMEM. */
int nntile_host_arena_alloc(void **ptr, size_t size) NNTILE_CHECKED;
/* 1 when ptr was the arena's (and is now free), 0 otherwise. */
int nntile_host_arena_free(void *ptr);
/* Free blocks of the chunks: how many, and the largest (for tests: after every block is
 * freed, one per chunk, each a whole chunk). */
size_t nntile_host_arena_free_blocks(size_t *largest);

#endif
