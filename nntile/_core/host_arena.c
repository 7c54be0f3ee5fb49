/* Pinned host memory taken ahead of StarPU's need.
 *
 * Past GPU memory StarPU evicts tiles into host memory that it pins as it goes
 * (cudaHostAlloc), from the thread that drives every CUDA worker of the GPU: while the driver
 * pins, no worker of that GPU launches or copies. The first steps of a run past GPU memory
 * pin tens of GiB that way (docs/performance.md, "Step 1 past GPU memory"). The arena pins
 * large chunks on a thread of its own, a headroom ahead of use and several times faster than
 * cudaHostAlloc (take_memory), and serves StarPU's pinned host allocations (the tiles' host
 * copies) from them through starpu_malloc_set_hooks; others keep StarPU's own way.
 *
 * The chunks are cut by best fit into page-aligned blocks, kept in one array sorted by
 * address; a freed block merges with free neighbours of its chunk. All pinned memory handed
 * out, in chunks or outside them, stays within ``cap`` (StarPU's host limit): past it an
 * allocation is refused with -ENOMEM, and StarPU reclaims host memory and asks again. */
#include "host_arena.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <starpu.h>
#if NNTILE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define PAGE ((size_t)4096)

struct block {
    char *start;
    size_t size;
    int chunk;
    int used;
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t need;   /* the filler sleeps on it while the headroom is free */
    pthread_cond_t grown;  /* callers sleep on it for the filler's next chunk */
    int running, stopping, filling, waiting, pinned, hooks, filler_live;
    size_t target, cap, chunk, headroom;
    struct block *chunks;  /* what the filler pinned, in order */
    size_t nchunks, chunks_room;
    struct block *blocks;
    size_t nblocks, blocks_room;
    struct block *outside;  /* live pinned allocations made outside the chunks */
    size_t noutside, outside_room;
    size_t outside_bytes;
    struct nntile_host_arena_stats st;
    pthread_t filler;
} A = {.lock = PTHREAD_MUTEX_INITIALIZER, .need = PTHREAD_COND_INITIALIZER,
       .grown = PTHREAD_COND_INITIALIZER};

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

struct touch_slice {
    char *start;
    size_t size;
};

static void *touch_pages(void *arg)
{
    const struct touch_slice *slice = arg;
    for (size_t off = 0; off < slice->size; off += PAGE)
        ((volatile char *)slice->start)[off] = 0;
    return NULL;
}

/* Fault every page of [p, p + size) in, on up to TOUCH_THREADS threads: the kernel zeroes
 * pages as fast as memory bandwidth allows, which one thread does not reach. */
static void touch(char *p, size_t size)
{
    enum { TOUCH_THREADS = 8 };
    struct touch_slice slices[TOUCH_THREADS];
    pthread_t threads[TOUCH_THREADS];
    int n = size >= ((size_t)64 << 20) ? TOUCH_THREADS : 1, started = 0;
    size_t share = (size / PAGE + n - 1) / n * PAGE;
    for (int i = 0; i < n; ++i) {
        size_t from = (size_t)i * share;
        slices[i].start = p + from;
        slices[i].size = from >= size ? 0 : (size - from < share ? size - from : share);
    }
    for (int i = 1; i < n; ++i)
        if (pthread_create(&threads[i], NULL, touch_pages, &slices[i]) == 0)
            started |= 1 << i;
        else
            touch_pages(&slices[i]);
    touch_pages(&slices[0]);
    for (int i = 1; i < n; ++i)
        if (started & (1 << i))
            pthread_join(threads[i], NULL);
}

/* Pinned memory the fast way: anonymous pages (huge where the kernel gives them), faulted in
 * by several threads, then registered with CUDA. cudaHostAlloc does all of it in the driver,
 * several times slower, and holds a lock that stalls every other CUDA call of the process
 * meanwhile (bench/pinned_alloc.py; docs/performance.md, "Host memory pinned ahead").
 * ``pinned`` = 0
 * stops before the registration (tests without CUDA). */
static void *take_memory(size_t size, int pinned)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, size, MADV_HUGEPAGE);  /* a hint: without transparent huge pages, small ones */
#endif
    touch(p, size);
#if NNTILE_HAVE_CUDA
    if (pinned) {
        /* as StarPU pins: portable (every GPU), mapped where the device can map host memory */
        if (cudaHostRegister(p, size, cudaHostRegisterPortable | cudaHostRegisterMapped)
                != cudaSuccess
            && cudaHostRegister(p, size, cudaHostRegisterPortable) != cudaSuccess) {
            (void)cudaGetLastError();  /* must not surface in a later kernel's check */
            munmap(p, size);
            return NULL;
        }
    }
#else
    (void)pinned;
#endif
    return p;
}

static void give_memory(void *p, size_t size, int pinned)
{
#if NNTILE_HAVE_CUDA
    if (pinned) {
        cudaHostUnregister(p);
        (void)cudaGetLastError();
    }
#else
    (void)pinned;
#endif
    munmap(p, size);
}

/* Room for one more block in an array of ``count`` with room for ``*room`` (doubled). */
static int room_for_one(struct block **array, size_t count, size_t *room)
{
    if (count < *room)
        return 0;
    size_t more = *room ? 2 * *room : 64;
    struct block *grown = realloc(*array, more * sizeof *grown);
    if (grown == NULL)
        return -ENOMEM;
    *array = grown;
    *room = more;
    return 0;
}

/* Insert block b at index i of the sorted array (with A.lock held). */
static int insert_block(size_t i, struct block b)
{
    if (room_for_one(&A.blocks, A.nblocks, &A.blocks_room) != 0)
        return -ENOMEM;
    memmove(A.blocks + i + 1, A.blocks + i, (A.nblocks - i) * sizeof *A.blocks);
    A.blocks[i] = b;
    A.nblocks++;
    return 0;
}

static void remove_block(size_t i)
{
    memmove(A.blocks + i, A.blocks + i + 1, (A.nblocks - i - 1) * sizeof *A.blocks);
    A.nblocks--;
}

/* The index of the first block that starts at or after p. */
static size_t block_at(const char *p)
{
    size_t lo = 0, hi = A.nblocks;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (A.blocks[mid].start < p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int add_chunk(void *p, size_t size)
{
    struct block whole = {p, size, (int)A.nchunks, 0};
    if (room_for_one(&A.chunks, A.nchunks, &A.chunks_room) != 0
        || insert_block(block_at(p), whole) != 0)
        return -ENOMEM;
    A.chunks[A.nchunks++] = whole;
    A.st.pinned += size;
    return 0;
}

static void *alloc_locked(size_t size)
{
    size_t best = A.nblocks;
    for (size_t i = 0; i < A.nblocks; ++i)
        if (!A.blocks[i].used && A.blocks[i].size >= size
            && (best == A.nblocks || A.blocks[i].size < A.blocks[best].size))
            best = i;
    if (best == A.nblocks)
        return NULL;
    struct block *b = &A.blocks[best];
    if (b->size > size) {
        struct block rest = {b->start + size, b->size - size, b->chunk, 0};
        if (insert_block(best + 1, rest) != 0)
            return NULL;
        b = &A.blocks[best];  /* the array may have moved */
        b->size = size;
    }
    b->used = 1;
    A.st.in_use += size;
    if (A.st.in_use > A.st.peak_in_use)
        A.st.peak_in_use = A.st.in_use;
    A.st.served++;
    return b->start;
}

static int adjacent(const struct block *a, const struct block *b)
{
    return a->chunk == b->chunk && a->start + a->size == b->start && !a->used && !b->used;
}

static int free_locked(void *ptr)
{
    size_t i = block_at(ptr);
    if (i == A.nblocks || A.blocks[i].start != (char *)ptr || !A.blocks[i].used)
        return 0;
    A.blocks[i].used = 0;
    A.st.in_use -= A.blocks[i].size;
    if (i + 1 < A.nblocks && adjacent(&A.blocks[i], &A.blocks[i + 1])) {
        A.blocks[i].size += A.blocks[i + 1].size;
        remove_block(i + 1);
    }
    if (i > 0 && adjacent(&A.blocks[i - 1], &A.blocks[i])) {
        A.blocks[i - 1].size += A.blocks[i].size;
        remove_block(i);
    }
    return 1;
}

static void *fill(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&A.lock);
    while (!A.stopping && A.st.pinned < A.target) {
        if (A.st.pinned - A.st.in_use >= A.headroom && !A.waiting) {
            pthread_cond_wait(&A.need, &A.lock);
            continue;
        }
        size_t size = A.target - A.st.pinned < A.chunk ? A.target - A.st.pinned : A.chunk;
        /* what was pinned outside the chunks counts against the cap too */
        size_t room = A.st.pinned + A.outside_bytes < A.cap
                          ? A.cap - A.st.pinned - A.outside_bytes : 0;
        if (size > room)
            size = room / PAGE * PAGE;
        if (size == 0)
            break;
        pthread_mutex_unlock(&A.lock);
        double start = now();
        void *p = take_memory(size, A.pinned);
        double took = now() - start;
        pthread_mutex_lock(&A.lock);
        if (p == NULL)
            break;  /* the machine has no more to pin: serve what there is */
        if (add_chunk(p, size) != 0) {
            give_memory(p, size, A.pinned);
            break;
        }
        A.st.pin_seconds += took;
        pthread_cond_broadcast(&A.grown);
    }
    A.filling = 0;
    pthread_cond_broadcast(&A.grown);
    pthread_mutex_unlock(&A.lock);
    return NULL;
}

int nntile_host_arena_alloc(void **ptr, size_t size)
{
    size = (size + PAGE - 1) / PAGE * PAGE;
    pthread_mutex_lock(&A.lock);
    void *p = NULL;
    double waited_from = 0.0;
    while (A.running && (p = alloc_locked(size)) == NULL && A.filling && size <= A.chunk) {
        /* the filler is behind: wake it and wait for its next chunk */
        if (waited_from == 0.0)
            waited_from = now();
        A.waiting++;
        pthread_cond_signal(&A.need);
        pthread_cond_wait(&A.grown, &A.lock);
        A.waiting--;
    }
    if (waited_from != 0.0)
        A.st.wait_seconds += now() - waited_from;
    pthread_mutex_unlock(&A.lock);
    if (p == NULL)
        return -ENOMEM;
    *ptr = p;
    return 0;
}

int nntile_host_arena_free(void *ptr)
{
    pthread_mutex_lock(&A.lock);
    int ours = A.running && free_locked(ptr);
    if (ours && A.st.pinned - A.st.in_use < A.headroom)
        pthread_cond_signal(&A.need);
    pthread_mutex_unlock(&A.lock);
    return ours;
}

/* A pinned allocation made outside the chunks, remembered so that its free undoes it the
 * same way (memory StarPU pinned itself before the hooks were set is not in this list). */
static int remember_outside(void *p, size_t size)
{
    if (room_for_one(&A.outside, A.noutside, &A.outside_room) != 0)
        return -ENOMEM;
    A.outside[A.noutside++] = (struct block){p, size, -1, 1};
    A.outside_bytes += size;
    return 0;
}

static size_t forget_outside(void *p)
{
    for (size_t i = 0; i < A.noutside; ++i)
        if (A.outside[i].start == (char *)p) {
            size_t size = A.outside[i].size;
            A.outside[i] = A.outside[--A.noutside];
            A.outside_bytes -= size;
            return size;
        }
    return 0;
}

/* StarPU strips STARPU_MALLOC_COUNT before its memory nodes allocate (it counts first), so
 * the tiles' host copies and StarPU's own pinned buffers arrive alike: pinned. */
static int hook_malloc(unsigned node, void **ptr, size_t dim, int flags)
{
    (void)node;
    if (!(flags & STARPU_MALLOC_PINNED)) {
        *ptr = malloc(dim);
        return *ptr ? 0 : -ENOMEM;
    }
    if (nntile_host_arena_alloc(ptr, dim) == 0)
        return 0;
    pthread_mutex_lock(&A.lock);
    int within = A.st.pinned + A.outside_bytes + dim <= A.cap;
    if (!within)
        A.st.refused++;
    pthread_mutex_unlock(&A.lock);
    if (!within)
        return -ENOMEM;
    void *p = take_memory(dim, A.pinned);
    if (p == NULL)
        return -ENOMEM;
    pthread_mutex_lock(&A.lock);
    int kept = remember_outside(p, dim) == 0;
    if (kept)
        A.st.outside++;
    pthread_mutex_unlock(&A.lock);
    if (!kept) {
        give_memory(p, dim, A.pinned);
        return -ENOMEM;
    }
    *ptr = p;
    return 0;
}

static int hook_free(unsigned node, void *ptr, size_t dim, int flags)
{
    (void)node;
    (void)dim;
    if (nntile_host_arena_free(ptr))
        return 0;
    if (!(flags & STARPU_MALLOC_PINNED)) {
        free(ptr);
        return 0;
    }
    pthread_mutex_lock(&A.lock);
    size_t size = forget_outside(ptr);
    pthread_mutex_unlock(&A.lock);
    if (size) {
        give_memory(ptr, size, A.pinned);
        return 0;
    }
#if NNTILE_HAVE_CUDA
    cudaFreeHost(ptr);  /* pinned by StarPU before the hooks were set */
    (void)cudaGetLastError();
#endif
    return 0;
}

int nntile_host_arena_start(size_t target, size_t cap, size_t chunk, size_t headroom,
                            int pinned, int hooks)
{
    if (chunk == 0 || chunk % PAGE != 0 || target > cap)
        return -EINVAL;
#if !NNTILE_HAVE_CUDA
    if (pinned)
        return -ENOSYS;
#endif
    pthread_mutex_lock(&A.lock);
    if (A.running || A.nchunks) {
        pthread_mutex_unlock(&A.lock);
        return -EBUSY;
    }
    A.target = target, A.cap = cap, A.chunk = chunk, A.headroom = headroom;
    A.pinned = pinned, A.hooks = hooks, A.stopping = 0, A.waiting = 0;
    A.outside_bytes = 0;
    A.noutside = 0;
    memset(&A.st, 0, sizeof A.st);
    A.filling = 1;
    A.running = 1;
    A.filler_live = 1;
    if (pthread_create(&A.filler, NULL, fill, NULL) != 0) {
        A.filling = A.running = A.filler_live = 0;
        pthread_mutex_unlock(&A.lock);
        return -ENOMEM;
    }
    pthread_mutex_unlock(&A.lock);
    if (hooks)
        starpu_malloc_set_hooks(hook_malloc, hook_free);
    return 0;
}

int nntile_host_arena_stop(void)
{
    pthread_mutex_lock(&A.lock);
    if (!A.running) {
        pthread_mutex_unlock(&A.lock);
        return 0;
    }
    A.stopping = 1;
    int join = A.filler_live;
    A.filler_live = 0;
    pthread_cond_broadcast(&A.need);
    pthread_mutex_unlock(&A.lock);
    if (join)
        pthread_join(A.filler, NULL);
    if (A.hooks)
        starpu_malloc_set_hooks(NULL, NULL);
    pthread_mutex_lock(&A.lock);
    /* Blocks may still be in use: StarPU frees the host copies of tiles at shutdown but not
     * the chunks its suballocator cut small buffers from on the host node, which it forgets
     * at the next start. Nothing refers to them once StarPU has stopped. */
    for (size_t i = 0; i < A.nchunks; ++i)
        give_memory(A.chunks[i].start, A.chunks[i].size, A.pinned);
    for (size_t i = 0; i < A.noutside; ++i)
        give_memory(A.outside[i].start, A.outside[i].size, A.pinned);
    A.nchunks = 0;
    A.nblocks = 0;
    A.noutside = 0;
    A.outside_bytes = 0;
    A.running = 0;
    pthread_mutex_unlock(&A.lock);
    return 0;
}

double nntile_host_arena_pin_all(void)
{
    pthread_mutex_lock(&A.lock);
    double start = now();
    A.headroom = A.target;  /* pinned - in_use stays below it until the target is pinned */
    pthread_cond_signal(&A.need);
    while (A.running && A.filling)
        pthread_cond_wait(&A.grown, &A.lock);
    double waited = now() - start;
    pthread_mutex_unlock(&A.lock);
    return waited;
}

int nntile_host_arena_running(void)
{
    pthread_mutex_lock(&A.lock);
    int running = A.running;
    pthread_mutex_unlock(&A.lock);
    return running;
}

void nntile_host_arena_read_stats(struct nntile_host_arena_stats *stats)
{
    pthread_mutex_lock(&A.lock);
    *stats = A.st;
    pthread_mutex_unlock(&A.lock);
}

size_t nntile_host_arena_free_blocks(size_t *largest)
{
    size_t count = 0;
    pthread_mutex_lock(&A.lock);
    *largest = 0;
    for (size_t i = 0; i < A.nblocks; ++i)
        if (!A.blocks[i].used) {
            count++;
            if (A.blocks[i].size > *largest)
                *largest = A.blocks[i].size;
        }
    pthread_mutex_unlock(&A.lock);
    return count;
}
