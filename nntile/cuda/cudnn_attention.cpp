/* The bf16_fp32 column of flash_forward / flash_backward (bf16 q, k, v, o and
 * gradients, fp32 lse): cuDNN's fused SDPA through the cudnn-frontend graph
 * API where it applies, flash.cu's bf16 tensor-core kernels otherwise.
 *
 * cuDNN applies to a call that writes its outputs (accumulate == 0: the
 * first key tile of a forward, a backward that neither adds to dq nor to
 * dk/dv) with head dimensions a multiple of 8 up to 256, whose mask cuDNN can
 * state: none (every key visible from every query: nntile_mask_whole), or the
 * diagonal band "key - query > right_bound" with right_bound = q_offset +
 * mask.offset - k_offset >= 0 (top-left alignment; 0 is the plain causal
 * mask), with a window its left bound "query - key < window - right_bound"
 * (cuDNN's sliding window).  A tile where some query sees no key at all and
 * every merge of key tiles run our kernels.
 *
 * Graphs are built once per shape (every extent, the mask, the scale, the
 * direction) and kept per thread and device with that thread's cuDNN handle,
 * which each call binds to the task's stream.  One StarPU thread may drive
 * several workers of a GPU (STARPU_NWORKER_PER_CUDA), one stream each, whose
 * calls overlap on the device: so nothing a call writes is kept per thread.
 * A graph cuDNN refuses (at build or execution) is reported once and the call
 * runs our kernels; a failing cudnnCreate likewise.
 *
 * Workspace: scratch memory ordered on the call's stream (scratch.h), from a
 * pool that keeps its memory.  It holds cuDNN's workspace (backward: an fp32
 * dq accumulator, batch*hq*tq*d floats, and softmax sums; GQA adds fp32 dk/dv
 * of every query head) and cuDNN's statistics in its layout [batch, hq, tq]
 * (cuDNN before 9.26 reads other layouts wrongly), which a small kernel swaps
 * with our [batch, tq, hq].  StarPU's memory accounting does not see it.
 *
 * NNTILE_CUDNN_ATTENTION=0 in the environment turns cuDNN off (our kernels
 * for every call).  nntile_cuda_flash_cudnn_counts tells how many calls ran
 * on cuDNN and how many fell back, and the largest workspace a call took.
 *
 * Host code only, compiled with the frontend's own headers hidden
 * (-fvisibility=hidden): a process may hold another copy of the header-only
 * frontend (PyTorch has one), and neither must bind to the other's. */
#include <pthread.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include <cudnn_frontend.h>

#pragma GCC visibility push(default)
#include "cuda_kernels.h"
#pragma GCC visibility pop
#include "flash.h"
#include "scratch.h"

namespace fe = cudnn_frontend;

namespace nntile_cuda {
namespace {

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

std::atomic<int64_t> counts[4]; /* forward, backward on cuDNN; fell back */
std::atomic<int64_t> largest_workspace(0); /* bytes */

bool cudnn_enabled()
{
    /* on unless NNTILE_CUDNN_ATTENTION=0: under StarPU it beat our bf16
     * kernels in training steps (docs/performance.md, "cuDNN's attention
     * under StarPU") */
    static const bool on = [] {
        const char *e = std::getenv("NNTILE_CUDNN_ATTENTION");
        return !(e && std::strcmp(e, "0") == 0);
    }();
    return on;
}

/* NNTILE_CUDNN_TRACE=1: one line on stderr per step of every call (thread,
 * shape, pointers, build, execute, a stream synchronisation after it): where
 * a call fails or hangs inside a training run */
bool trace_on()
{
    static const bool on = [] {
        const char *e = std::getenv("NNTILE_CUDNN_TRACE");
        return e && std::strcmp(e, "1") == 0;
    }();
    return on;
}

#define CUDNN_TRACE(...)                                                       \
    do {                                                                       \
        if (trace_on()) {                                                      \
            fprintf(stderr, "nntile cudnn trace [%lx] ",                       \
                    (unsigned long)pthread_self());                            \
            fprintf(stderr, __VA_ARGS__);                                      \
            fputc('\n', stderr);                                               \
            fflush(stderr);                                                    \
        }                                                                      \
    } while (0)

/* What a graph depends on; right_bound -1: no mask; left_bound 0: no window. */
struct Shape {
    int64_t batch, tq, tk, hq, hkv, d, right_bound, left_bound;
    double scale;
    bool backward;
    bool operator==(const Shape &o) const
    {
        return batch == o.batch && tq == o.tq && tk == o.tk && hq == o.hq
               && hkv == o.hkv && d == o.d && right_bound == o.right_bound
               && left_bound == o.left_bound && scale == o.scale && backward == o.backward;
    }
};

struct ShapeHash {
    size_t operator()(const Shape &s) const
    {
        size_t h = std::hash<bool>()(s.backward);
        for (int64_t v : {s.batch, s.tq, s.tk, s.hq, s.hkv, s.d, s.right_bound,
                          s.left_bound})
            h = h * 1000003u ^ std::hash<int64_t>()(v);
        return h * 1000003u ^ std::hash<double>()(s.scale);
    }
};

struct Plan {
    std::shared_ptr<fe::graph::Graph> graph; /* null: cuDNN refused */
    int64_t workspace = 0;
};

struct DeviceState {
    cudnnHandle_t handle = nullptr; /* null: cudnnCreate failed */
    std::unordered_map<Shape, Plan, ShapeHash> plans;
    ~DeviceState()
    {
        /* at thread exit (StarPU's shutdown, or the process's end, before
         * the CUDA runtime's own teardown); failures cannot be acted on */
        CUDNN_TRACE("state freed: %zu plans", plans.size());
        plans.clear(); /* the graphs' descriptors before the handle they use */
        if (handle)
            (void)cudnnDestroy(handle);
    }
};

thread_local std::unordered_map<int, std::unique_ptr<DeviceState>> t_states;

/* This thread's state for the current device; null when there is none. */
DeviceState *device_state()
{
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return nullptr;
    }
    std::unique_ptr<DeviceState> &st = t_states[dev];
    if (!st) {
        st.reset(new DeviceState);
        const cudnnStatus_t err = cudnnCreate(&st->handle);
        CUDNN_TRACE("state of device %d: cudnnCreate %s", dev, cudnnGetErrorString(err));
        if (err != CUDNN_STATUS_SUCCESS) {
            st->handle = nullptr;
            fprintf(stderr, "nntile: cuDNN unavailable on device %d (%s); bf16 "
                            "attention runs nntile's kernels\n",
                    dev, cudnnGetErrorString(err));
        }
    }
    return st->handle ? st.get() : nullptr;
}

/* [batch, heads, seq, d] tensors stored [batch, seq, heads, d] */
fe::graph::Tensor_attributes bshd(const char *name, int64_t uid, int64_t b,
                                  int64_t h, int64_t s, int64_t d)
{
    return fe::graph::Tensor_attributes()
        .set_name(name)
        .set_uid(uid)
        .set_dim({b, h, s, d})
        .set_stride({s * h * d, d, h * d, 1});
}

/* cuDNN's statistics [batch, hq, tq, 1], packed */
void stats_layout(fe::graph::Tensor_attributes &t, const Shape &s)
{
    t.set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({s.batch, s.hq, s.tq, 1})
        .set_stride({s.hq * s.tq, s.tq, 1, 1});
}

template <typename Attributes> void set_mask(Attributes &a, const Shape &s)
{
    if (s.right_bound >= 0)
        a.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
            .set_diagonal_band_right_bound((int)s.right_bound);
    if (s.left_bound > 0) /* the window: query - key < left_bound */
        a.set_diagonal_band_left_bound((int)s.left_bound);
}

/* The graph of a shape, built and checked; on failure a null graph and why. */
Plan build(const Shape &s, cudnnHandle_t handle, std::string &why)
{
    Plan plan;
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto Q = g->tensor(bshd("q", kQ, s.batch, s.hq, s.tq, s.d));
    auto K = g->tensor(bshd("k", kK, s.batch, s.hkv, s.tk, s.d));
    auto V = g->tensor(bshd("v", kV, s.batch, s.hkv, s.tk, s.d));
    if (!s.backward) {
        auto opts = fe::graph::SDPA_attributes()
                        .set_name("flash_forward")
                        .set_generate_stats(true)
                        .set_attn_scale((float)s.scale);
        set_mask(opts, s);
        auto outs = g->sdpa(Q, K, V, opts);
        outs[0]->set_output(true)
            .set_uid(kO)
            .set_dim({s.batch, s.hq, s.tq, s.d})
            .set_stride({s.tq * s.hq * s.d, s.d, s.hq * s.d, 1});
        outs[1]->set_output(true);
        stats_layout(*outs[1], s);
    } else {
        auto O = g->tensor(bshd("o", kO, s.batch, s.hq, s.tq, s.d));
        auto dO = g->tensor(bshd("dout", kDO, s.batch, s.hq, s.tq, s.d));
        fe::graph::Tensor_attributes stats;
        stats.set_name("lse");
        stats_layout(stats, s);
        auto Stats = g->tensor(stats);
        auto opts = fe::graph::SDPA_backward_attributes()
                        .set_name("flash_backward")
                        .set_attn_scale((float)s.scale);
        set_mask(opts, s);
        auto outs = g->sdpa_backward(Q, K, V, O, dO, Stats, opts);
        const int64_t uids[3] = {kDQ, kDK, kDV};
        for (int i = 0; i < 3; ++i) {
            const int64_t h = i == 0 ? s.hq : s.hkv, t = i == 0 ? s.tq : s.tk;
            outs[i]->set_output(true)
                .set_uid(uids[i])
                .set_dim({s.batch, h, t, s.d})
                .set_stride({t * h * s.d, s.d, h * s.d, 1});
        }
    }
    const std::pair<const char *, std::function<fe::error_t()>> steps[] = {
        {"validate", [&] { return g->validate(); }},
        {"build_operation_graph", [&] { return g->build_operation_graph(handle); }},
        {"create_execution_plans",
         [&] { return g->create_execution_plans({fe::HeurMode_t::A}); }},
        {"check_support", [&] { return g->check_support(); }},
        {"build_plans", [&] { return g->build_plans(); }},
        {"get_workspace_size", [&] { return g->get_workspace_size(plan.workspace); }},
    };
    for (const auto &step : steps) {
        fe::error_t err = step.second();
        if (!err.is_good()) {
            why = std::string(step.first) + ": " + err.get_message();
            return Plan();
        }
    }
    plan.graph = g;
    return plan;
}

/* The cached plan of a shape (built on first use); null graph: refused. */
const Plan &plan_for(DeviceState &st, const Shape &s)
{
    auto it = st.plans.find(s);
    if (it != st.plans.end())
        return it->second;
    std::string why;
    Plan plan;
    CUDNN_TRACE("build %s b %lld tq %lld tk %lld h %lld/%lld d %lld band %lld",
                s.backward ? "bwd" : "fwd", (long long)s.batch, (long long)s.tq,
                (long long)s.tk, (long long)s.hq, (long long)s.hkv, (long long)s.d,
                (long long)s.right_bound);
    try {
        plan = build(s, st.handle, why);
    } catch (const std::exception &e) {
        why = e.what();
    } catch (...) {
        why = "unknown exception";
    }
    CUDNN_TRACE("built: %s, workspace %lld", plan.graph ? "ok" : why.c_str(),
                (long long)plan.workspace);
    if (!plan.graph)
        fprintf(stderr, "nntile: cuDNN SDPA %s refused batch %lld, tq %lld, "
                        "tk %lld, heads %lld/%lld, d %lld (%s); nntile's "
                        "kernels run it\n",
                s.backward ? "backward" : "forward", (long long)s.batch,
                (long long)s.tq, (long long)s.tk, (long long)s.hq,
                (long long)s.hkv, (long long)s.d, why.c_str());
    return st.plans.emplace(s, std::move(plan)).first->second;
}

/* The shape of a call cuDNN may take, or false. */
bool shape_of(const nntile_flash_args *a, bool backward,
              std::initializer_list<const void *> ptrs, Shape &s)
{
    if (!cudnn_enabled() || a->accumulate != 0 || a->batch < 1 || a->tq < 1
        || a->tk < 1 || a->hq < 1 || a->hkv < 1 || a->hq % a->hkv != 0
        || a->d < 8 || a->d > 256 || a->d % 8 != 0)
        return false;
    for (const void *p : ptrs)
        if ((uintptr_t)p % 16 != 0)
            return false;
    int64_t right_bound = -1, left_bound = 0;
    if (!nntile_mask_whole(a->mask, a->q_offset, a->q_offset + a->tq, a->k_offset,
                           a->k_offset + a->tk)) {
        right_bound = a->q_offset + a->mask.offset - a->k_offset;
        if (right_bound < 0)
            return false; /* some queries see no key */
        if (right_bound + a->tq < a->tk)
            return false; /* keys past the last query's (a key/value cache not full yet):
                           * the band moves with every new token, a graph each; ours */
        if (a->mask.window > 0) {
            /* the window as cuDNN's left bound: key - query > right_bound - window */
            left_bound = a->mask.window - right_bound;
            /* cuDNN takes a left bound only with a positive value and no more queries
             * than keys; the last query must see a key (rows of none: ours) */
            if (left_bound <= 0 || a->tq > a->tk
                || a->tq - 1 + right_bound - a->mask.window + 1 >= a->tk)
                return false;
        }
    }
    s = Shape{a->batch, a->tq, a->tk, a->hq, a->hkv, a->d, right_bound,
              left_bound, a->scale, backward};
    return true;
}

/* Runs a plan with the pointers of pack, cuDNN's statistics in the
 * workspace: swapped in from lse_in (backward) or out to lse_out (forward).
 * false when cuDNN fails (nothing to undo: our kernels then rewrite every
 * output). */
bool execute(DeviceState &st, const Shape &s, const Plan &plan,
             cudaStream_t stream, std::unordered_map<int64_t, void *> &pack,
             const float *lse_in, float *lse_out)
{
    const size_t ws = ((size_t)plan.workspace + 255) / 256 * 256;
    const size_t bytes = ws + (size_t)s.batch * s.hq * s.tq * sizeof(float);
    Scratch scratch(bytes, stream); /* freed on the stream after this call's work */
    if (!scratch.ptr)
        return false; /* out of memory: our kernels need no workspace */
    int64_t seen = largest_workspace.load();
    while ((int64_t)bytes > seen && !largest_workspace.compare_exchange_weak(seen, bytes)) {
    }
    float *stats = (float *)((char *)scratch.ptr + ws);
    pack[kStats] = stats;
    cudnnStatus_t cs = cudnnSetStream(st.handle, stream);
    if (cs != CUDNN_STATUS_SUCCESS) {
        fprintf(stderr, "nntile cudnn attention: cudnnSetStream: %s\n",
                cudnnGetErrorString(cs));
        return false;
    }
    if (lse_in && swap_inner_axes(lse_in, stats, s.batch, s.tq, s.hq, stream)
                      != cudaSuccess)
        return false;
    fe::error_t err;
    CUDNN_TRACE("execute %s on stream %p: workspace %p (%zu bytes), stats %p",
                s.backward ? "bwd" : "fwd", (void *)stream, scratch.ptr, ws,
                (void *)stats);
    try {
        err = plan.graph->execute(st.handle, pack, scratch.ptr);
    } catch (const std::exception &e) {
        err = fe::error_t(fe::error_code_t::GRAPH_EXECUTION_FAILED, e.what());
    }
    if (trace_on()) {
        const cudaError_t ce = cudaStreamSynchronize(stream);
        CUDNN_TRACE("executed: %s; stream %s", err.is_good() ? "ok" : err.get_message().c_str(),
                    cudaGetErrorString(ce));
    }
    if (!err.is_good()) {
        static std::atomic<bool> told(false);
        if (!told.exchange(true))
            fprintf(stderr, "nntile: cuDNN SDPA failed (%s); nntile's kernels "
                            "run such calls\n", err.get_message().c_str());
        return false;
    }
    if (lse_out) {
        const cudaError_t ce =
            swap_inner_axes(stats, lse_out, s.batch, s.hq, s.tq, stream);
        if (ce != cudaSuccess) {
            fprintf(stderr, "nntile cudnn attention: %s\n", cudaGetErrorString(ce));
            return false;
        }
    }
    return true;
}

/* The plan of a call cuDNN may take, with this thread's state for the
 * current device; null when cuDNN does not take it. */
const Plan *prepare(const nntile_flash_args *a, bool backward,
                    std::initializer_list<const void *> ptrs, Shape &s,
                    DeviceState *&st)
{
    if (!shape_of(a, backward, ptrs, s) || !(st = device_state()))
        return nullptr;
    const Plan &plan = plan_for(*st, s);
    return plan.graph ? &plan : nullptr;
}

bool cudnn_forward(const nntile_flash_args *a, cudaStream_t stream,
                   const uint16_t *q, const uint16_t *k, const uint16_t *v,
                   uint16_t *o, float *lse)
{
    Shape s;
    DeviceState *st;
    const Plan *plan = prepare(a, false, {q, k, v, o}, s, st);
    std::unordered_map<int64_t, void *> pack = {
        {kQ, (void *)q}, {kK, (void *)k}, {kV, (void *)v}, {kO, o}};
    return plan && execute(*st, s, *plan, stream, pack, nullptr, lse);
}

bool cudnn_backward(const nntile_flash_args *a, cudaStream_t stream,
                    const uint16_t *q, const uint16_t *k, const uint16_t *v,
                    const uint16_t *o, const uint16_t *dout, const float *lse,
                    uint16_t *dq, uint16_t *dk, uint16_t *dv)
{
    Shape s;
    DeviceState *st;
    const Plan *plan =
        prepare(a, true, {q, k, v, o, dout, dq, dk, dv}, s, st);
    std::unordered_map<int64_t, void *> pack = {
        {kQ, (void *)q}, {kK, (void *)k},       {kV, (void *)v},
        {kO, (void *)o}, {kDO, (void *)dout}, {kDQ, dq},
        {kDK, dk},       {kDV, dv}};
    return plan && execute(*st, s, *plan, stream, pack, lse, nullptr);
}

} // namespace
} // namespace nntile_cuda

#define CUDNN_TRACE_CALL(what, a)                                              \
    do {                                                                       \
        using nntile_cuda::trace_on;                                           \
        CUDNN_TRACE("call %s: b %lld tq %lld tk %lld h %lld/%lld d %lld "      \
                    "offsets %lld/%lld causal %d/%lld/%lld accumulate %d",     \
                    what, (long long)(a)->batch, (long long)(a)->tq,           \
                    (long long)(a)->tk, (long long)(a)->hq, (long long)(a)->hkv,\
                    (long long)(a)->d, (long long)(a)->q_offset,               \
                    (long long)(a)->k_offset, (int)(a)->mask.causal,           \
                    (long long)(a)->mask.window, (long long)(a)->mask.offset,  \
                    (int)(a)->accumulate);                                     \
    } while (0)

extern "C" NNTILE_CUDA_SIGNATURE(flash_forward, uint16_t, float, bf16_fp32,
                                  NNTILE_BUFFERS_flash_forward)
{
    bool done = false;
    CUDNN_TRACE_CALL("fwd", args);
    try {
        done = nntile_cuda::cudnn_forward(args, stream, q, k, v, o, lse);
    } catch (...) { /* std::bad_alloc and the like: our kernels then */
    }
    nntile_cuda::counts[done ? 0 : 2]++;
    if (!done)
        nntile_cuda::flash_forward_bf16_fp32(args, stream, q, k, v, o, lse);
}

extern "C" NNTILE_CUDA_SIGNATURE(flash_backward, uint16_t, float, bf16_fp32,
                                  NNTILE_BUFFERS_flash_backward)
{
    bool done = false;
    CUDNN_TRACE_CALL("bwd", args);
    try {
        done = nntile_cuda::cudnn_backward(args, stream, q, k, v, o, dout, lse,
                                           dq, dk, dv);
    } catch (...) {
    }
    nntile_cuda::counts[done ? 1 : 3]++;
    if (!done)
        nntile_cuda::flash_backward_bf16_fp32(args, stream, q, k, v, o, dout,
                                              lse, dq, dk, dv);
}

/* out[0], out[1]: the forward and backward calls of the bf16_fp32 column
 * that cuDNN ran, out[2], out[3]: those our kernels ran, since the process
 * started; out[4]: the bytes of the largest workspace a call took. */
extern "C" __attribute__((visibility("default"))) void
nntile_cuda_flash_cudnn_counts(int64_t *out)
{
    for (int i = 0; i < 4; ++i)
        out[i] = nntile_cuda::counts[i].load();
    out[4] = nntile_cuda::largest_workspace.load();
}
