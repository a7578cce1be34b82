/* cuda_backend.cu: context, buffers, timing and the bandwidth probe.
 * C-style CUDA: extern "C" entry points declared in cuda_backend.h. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cuda_internal.h"

extern "C" int cuda_open(cuda_ctx **out, int device, err *e)
{
    *out = NULL;
    int n = 0;
    /* With no driver (libcuda missing) or no GPU this returns an error code
     * (cudaErrorInsufficientDriver, cudaErrorNoDevice, ...), never traps. */
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
        cudaGetLastError();   /* clear the sticky-free error state */
        return err_setf(e, ERR_UNSUPPORTED, "cuda: no usable GPU: cudaGetDeviceCount: %s: %s", cudaGetErrorName(rc),
                        cudaGetErrorString(rc));
    }
    if (n <= 0) return err_setf(e, ERR_UNSUPPORTED, "cuda: no GPU found");
    if (device < 0 || device >= n)
        return err_setf(e, ERR_UNSUPPORTED, "cuda: device %d out of range (%d present)", device, n);
    cudaDeviceProp p;
    rc = cudaGetDeviceProperties(&p, device);
    if (rc != cudaSuccess) return err_setf(e, ERR_UNSUPPORTED, "cuda: cudaGetDeviceProperties: %s", cudaGetErrorString(rc));
    if (p.major < 9)
        return err_setf(e, ERR_UNSUPPORTED, "cuda: %s is compute capability %d.%d; this build targets 9.0 (Hopper)",
                        p.name, p.major, p.minor);
    if (cuda_fail(e, cudaSetDevice(device), "cudaSetDevice")) return e ? e->code : ERR_INTERNAL;

    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    if (!c) return err_setf(e, ERR_NOMEM, "cuda: out of memory");
    snprintf(c->info.name, sizeof c->info.name, "%s", p.name);
    c->info.device = device;
    c->info.cc_major = p.major;
    c->info.cc_minor = p.minor;
    c->info.sm_count = p.multiProcessorCount;
    c->info.global_mem = p.totalGlobalMem;
    c->info.l2_bytes = (size_t)p.l2CacheSize;
    c->info.smem_per_block_optin = p.sharedMemPerBlockOptin;
    cudaRuntimeGetVersion(&c->info.runtime_version);
    cudaDriverGetVersion(&c->info.driver_version);
    c->pdl = 1;   /* compute capability >= 9.0 (checked above) */

    int r = 0;
    if ((r = cuda_fail(e, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreate")) ||
        (r = cuda_fail(e, cudaEventCreate(&c->ev0), "cudaEventCreate")) ||
        (r = cuda_fail(e, cudaEventCreate(&c->ev1), "cudaEventCreate")) ||
        (r = cuda_fail(e, cudaStreamCreateWithFlags(&c->copy, cudaStreamNonBlocking), "cudaStreamCreate (copy)")) ||
        (r = cuda_fail(e, cudaEventCreateWithFlags(&c->ev_copy, cudaEventDisableTiming), "cudaEventCreate")) ||
        (r = cuda_matvec_init(c, e)) || (r = cuda_attention_init(c, e))) {
        cuda_close(c);
        return r;
    }
    *out = c;
    return 0;
}

extern "C" void cuda_set_pdl(cuda_ctx *c, int on) { c->pdl = on != 0; }

extern "C" void cuda_close(cuda_ctx *c)
{
    if (!c) return;
    if (c->stream) cudaStreamSynchronize(c->stream);
    cuda_trace_end(c);
    if (c->copy) cudaStreamSynchronize(c->copy);
    if (c->ev_copy) cudaEventDestroy(c->ev_copy);
    if (c->copy) cudaStreamDestroy(c->copy);
    if (c->ev0) cudaEventDestroy(c->ev0);
    if (c->ev1) cudaEventDestroy(c->ev1);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
}

extern "C" const char *cuda_device_name(const cuda_ctx *c) { return c ? c->info.name : "none"; }
extern "C" const cuda_info *cuda_get_info(const cuda_ctx *c) { return &c->info; }

extern "C" int cuda_alloc(cuda_ctx *c, void **dptr, size_t bytes, err *e)
{
    (void)c;
    *dptr = NULL;
    cudaError_t rc = cudaMalloc(dptr, bytes ? bytes : 1);
    if (rc != cudaSuccess) {
        *dptr = NULL;
        return err_setf(e, ERR_NOMEM, "cuda: cudaMalloc(%zu bytes): %s", bytes, cudaGetErrorString(rc));
    }
    return 0;
}

extern "C" void cuda_free(cuda_ctx *c, void *dptr)
{
    (void)c;
    if (dptr) cudaFree(dptr);
}

extern "C" int cuda_upload(cuda_ctx *c, void *dst, const void *src, size_t bytes, err *e)
{
    int r = cuda_fail(e, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), "upload");
    return r ? r : cuda_fail(e, cudaStreamSynchronize(c->stream), "upload (sync)");
}

extern "C" int cuda_download(cuda_ctx *c, void *dst, const void *src, size_t bytes, err *e)
{
    int r = cuda_fail(e, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream), "download");
    return r ? r : cuda_fail(e, cudaStreamSynchronize(c->stream), "download (sync)");
}

extern "C" int cuda_memset(cuda_ctx *c, void *dst, int byte, size_t bytes, err *e)
{
    return cuda_fail(e, cudaMemsetAsync(dst, byte, bytes, c->stream), "memset");
}

extern "C" int cuda_copy_d2d(cuda_ctx *c, void *dst, const void *src, size_t bytes, err *e)
{
    return cuda_fail(e, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream), "copy d2d");
}

static uintptr_t page_down(uintptr_t a) { return a & ~(uintptr_t)4095; }

extern "C" int cuda_host_register(cuda_ctx *c, const void *p, size_t bytes, int read_only, err *e)
{
    (void)c;
    const uintptr_t a0 = page_down((uintptr_t)p), a1 = page_down((uintptr_t)p + bytes + 4095);
    const unsigned flags = cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : 0u);
    const cudaError_t rc = cudaHostRegister((void *)a0, a1 - a0, flags);
    if (rc == cudaSuccess) return 0;
    cudaGetLastError();   /* clear the sticky-free error state */
    return err_setf(e, ERR_UNSUPPORTED, "cuda: cudaHostRegister of %zu bytes: %s", (size_t)(a1 - a0),
                    cudaGetErrorString(rc));
}

extern "C" void cuda_host_unregister(cuda_ctx *c, const void *p)
{
    (void)c;
    cudaHostUnregister((void *)page_down((uintptr_t)p));
    cudaGetLastError();
}

extern "C" int cuda_host_alloc(cuda_ctx *c, void **p, size_t bytes, err *e)
{
    (void)c;
    *p = NULL;
    const cudaError_t rc = cudaMallocHost(p, bytes ? bytes : 1);
    if (rc == cudaSuccess) return 0;
    *p = NULL;
    return err_setf(e, ERR_NOMEM, "cuda: cudaMallocHost(%zu bytes): %s", bytes, cudaGetErrorString(rc));
}

extern "C" void cuda_host_free(cuda_ctx *c, void *p)
{
    (void)c;
    if (p) cudaFreeHost(p);
}

extern "C" int cuda_copy_h2d(cuda_ctx *c, void *dst, const void *src, size_t bytes, err *e)
{
    return cuda_fail(e, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->copy), "copy h2d");
}

extern "C" int cuda_copy_fence(cuda_ctx *c, err *e)
{
    int r = cuda_fail(e, cudaEventRecord(c->ev_copy, c->copy), "copy fence (record)");
    return r ? r : cuda_fail(e, cudaStreamWaitEvent(c->stream, c->ev_copy, 0), "copy fence (wait)");
}

extern "C" int cuda_copy_wait(cuda_ctx *c, err *e)
{
    return cuda_fail(e, cudaStreamSynchronize(c->copy), "copy wait");
}

extern "C" int cuda_sync(cuda_ctx *c, err *e)
{
    return cuda_fail(e, cudaStreamSynchronize(c->stream), "sync");
}

extern "C" int cuda_timer_begin(cuda_ctx *c, err *e)
{
    return cuda_fail(e, cudaEventRecord(c->ev0, c->stream), "event record");
}

extern "C" int cuda_timer_end(cuda_ctx *c, float *ms, err *e)
{
    int r = cuda_fail(e, cudaEventRecord(c->ev1, c->stream), "event record");
    if (!r) r = cuda_fail(e, cudaEventSynchronize(c->ev1), "event sync");
    if (!r) r = cuda_fail(e, cudaEventElapsedTime(ms, c->ev0, c->ev1), "event elapsed");
    return r;
}

/* ==== Graphs ==== */

struct cuda_graph {
    cudaGraph_t     graph;
    cudaGraphExec_t exec;
};

extern "C" int cuda_graph_begin(cuda_ctx *c, err *e)
{
    return cuda_fail(e, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal), "stream begin capture");
}

extern "C" int cuda_graph_end(cuda_ctx *c, cuda_graph **out, err *e)
{
    *out = NULL;
    cudaGraph_t graph = NULL;
    cudaError_t rc = cudaStreamEndCapture(c->stream, &graph);
    if (rc != cudaSuccess || !graph) {
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        return cuda_fail(e, rc != cudaSuccess ? rc : cudaErrorStreamCaptureInvalidated, "stream end capture");
    }
    cudaGraphExec_t exec = NULL;
    rc = cudaGraphInstantiate(&exec, graph, 0);
    if (rc != cudaSuccess) {
        cudaGraphDestroy(graph);
        cudaGetLastError();
        return cuda_fail(e, rc, "graph instantiate");
    }
    cuda_graph *g = (cuda_graph *)calloc(1, sizeof *g);
    if (!g) {
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        return err_setf(e, ERR_NOMEM, "cuda: out of memory");
    }
    g->graph = graph;
    g->exec = exec;
    *out = g;
    return 0;
}

extern "C" int cuda_graph_launch(cuda_ctx *c, cuda_graph *g, err *e)
{
    if (!g) return err_setf(e, ERR_USAGE, "cuda_graph_launch: no graph");
    return cuda_fail(e, cudaGraphLaunch(g->exec, c->stream), "graph launch");
}

extern "C" int cuda_graph_kernels(const cuda_graph *g)
{
    size_t n = 0;
    if (!g || cudaGraphGetNodes(g->graph, NULL, &n) != cudaSuccess) return -1;
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)calloc(n ? n : 1, sizeof *nodes);
    if (!nodes) return -1;
    int k = -1;
    if (cudaGraphGetNodes(g->graph, nodes, &n) == cudaSuccess) {
        k = 0;
        for (size_t i = 0; i < n; i++) {
            cudaGraphNodeType ty;
            if (cudaGraphNodeGetType(nodes[i], &ty) == cudaSuccess && ty == cudaGraphNodeTypeKernel) k++;
        }
    }
    free(nodes);
    return k;
}

extern "C" void cuda_graph_free(cuda_graph *g)
{
    if (!g) return;
    if (g->exec) cudaGraphExecDestroy(g->exec);
    if (g->graph) cudaGraphDestroy(g->graph);
    free(g);
}

/* ==== Dependent-step latency ====
 * k_chain_step: one link of a chain of kernels, each a programmatic
 * dependent of the one before (as the decode graph's): every CTA waits, its
 * thread 0 reads the previous link's value at L2, CTA 0 writes value + 1.
 * k_barrier_chain: the same dependency inside one persistent grid, one
 * grid-wide barrier a link (the count's top bit flips once per barrier:
 * CTA 0 adds 2^31 - (G - 1), the others 1; cooperative groups' scheme). */
__global__ void k_chain_step(const unsigned *in, unsigned *out)
{
    pdl_enter();
    if (threadIdx.x == 0) {
        const unsigned v = __ldcg(in);
        if (blockIdx.x == 0) out[0] = v + 1;
    }
}

/* k_ticket_step: a k_chain_step link synchronised by tickets (see
 * cuda_step_probe's mode 2): tin is this link's ticket (NULL: the first
 * link), need the previous link's CTA count, tout the next link's. */
__global__ void k_ticket_step(const unsigned *tin, unsigned need, const unsigned *in, unsigned *out, unsigned *tout)
{
    if (threadIdx.x == 0 && tin) {
        unsigned now;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(now) : "l"(tin) : "memory");
        } while (now < need);
    }
    __syncthreads();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    if (threadIdx.x == 0) {
        const unsigned v = __ldcg(in);
        if (blockIdx.x == 0) out[0] = v + 1;
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(tout) : "memory");
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__global__ void k_barrier_chain(unsigned *bar, unsigned *val, int n)
{
    for (int i = 0; i < n; i++) {
        if (threadIdx.x == 0 && blockIdx.x == 0) val[0] = __ldcg(val) + 1;
        __syncthreads();
        if (threadIdx.x == 0) {
            const unsigned add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
            __threadfence();
            const unsigned old = atomicAdd(bar, add);
            unsigned now;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(now) : "l"(bar) : "memory");
            } while (((old ^ now) & 0x80000000u) == 0);
            __threadfence();
            (void)__ldcg(val);
        }
        __syncthreads();
    }
}

extern "C" int cuda_step_probe(cuda_ctx *c, int ctas, int mode, int steps, float *us, err *e)
{
    *us = 0;
    if (ctas < 1 || steps < 1 || steps > 100000 || mode < 0 || mode > 2)
        return err_setf(e, ERR_USAGE, "cuda_step_probe: ctas=%d mode=%d steps=%d", ctas, mode, steps);
    const int persistent = mode == 1;
    if (persistent) {
        int per_sm = 0;
        int r = cuda_fail(e, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_barrier_chain, 256, 0),
                          "step probe occupancy");
        if (r) return r;
        if (ctas > per_sm * c->info.sm_count)
            return err_setf(e, ERR_USAGE, "cuda_step_probe: %d CTAs are not all resident (%d an SM)", ctas, per_sm);
    }
    /* [0, 64): the values (and the barrier); mode 2: the links' tickets
     * after them, steps + 1 of them */
    const size_t nbuf = 64 + (mode == 2 ? (size_t)steps + 1 : 0);
    unsigned *buf = NULL;
    int r = cuda_fail(e, cudaMalloc((void **)&buf, nbuf * sizeof(unsigned)), "step probe alloc");
    if (r) return r;
    cuda_graph *g = NULL;
    if (!(r = cuda_fail(e, cudaMemsetAsync(buf, 0, 64 * sizeof(unsigned), c->stream), "step probe memset")) &&
        !(r = cuda_graph_begin(c, e))) {
        int rl = 0;
        if (mode == 2) {
            unsigned *tk = buf + 64;
            rl = cuda_memset(c, tk, 0, ((size_t)steps + 1) * sizeof(unsigned), e);
            for (int i = 0; i < steps && !rl; i++)
                rl = cuda_launch(c, k_ticket_step, dim3((unsigned)ctas), dim3(256), 0, e, "step probe",
                                 (const unsigned *)(i ? tk + i : NULL), (unsigned)ctas,
                                 (const unsigned *)(buf + 32 * (i & 1)), buf + 32 * (~i & 1), tk + i + 1);
        } else if (persistent) {
            k_barrier_chain<<<ctas, 256, 0, c->stream>>>(buf, buf + 32, steps);
            rl = cuda_launch_check(e, "step probe");
        } else {
            for (int i = 0; i < steps && !rl; i++)
                rl = cuda_launch(c, k_chain_step, dim3((unsigned)ctas), dim3(256), 0, e, "step probe",
                                 (const unsigned *)(buf + 32 * (i & 1)), buf + 32 * (~i & 1));
        }
        r = cuda_graph_end(c, &g, rl ? NULL : e);
        if (rl) r = rl;
    }
    float best = 0;
    for (int rep = 0; !r && rep < 6; rep++) {   /* the first replay warms up */
        float ms = 0;
        if ((r = cuda_timer_begin(c, e)) || (r = cuda_graph_launch(c, g, e)) || (r = cuda_timer_end(c, &ms, e))) break;
        if (rep > 0 && (best == 0 || ms < best)) best = ms;
    }
    cudaStreamSynchronize(c->stream);   /* the graph may not be freed, nor buf, while it runs */
    cuda_graph_free(g);
    cudaFree(buf);
    if (!r) *us = best * 1e3f / (float)steps;
    return r;
}

/* A warp's xor-fold of its lanes' acc into *sink, so the loads that made
 * acc cannot be dropped (one atomic a warp, practically never taken). */
__device__ __forceinline__ void fold_sink(uint32_t acc, uint32_t *sink)
{
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0 && acc == 0x9e3779b9u) atomicXor(sink, acc);
}

/* Grid-stride read of n16 uint4s; each thread keeps 4 independent loads in
 * flight per iteration; the xor-fold to *sink by fold_sink. */
__device__ __forceinline__ void read_fold(const uint4 *__restrict__ p, size_t n16, uint32_t *sink)
{
    uint32_t acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
              d = __ldcs(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n16; i += stride) {
        uint4 a = __ldcs(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    fold_sink(acc, sink);
}

/* The probe's pattern: a CTA of RP_THREADS reads one contiguous chunk of
 * RP_THREADS * RP_U uint4s (32 KB), thread t the uint4s t + RP_THREADS u,
 * all RP_U loads issued before the first is used; a warp's load is 512
 * contiguous bytes. On the H100 (session 18) this reads 3.16-3.18 TB/s
 * (128 MB and up; 0.95 of HBM3's 3.35 TB/s) where read_fold's grid-stride
 * form (4 loads in flight, 4.3 MB apart) read 2.60: the probe is the
 * denominator of decode's bandwidth fraction, so it must be the best read
 * this card does, not a pattern that leaves a fifth of it unused. */
#define RP_THREADS 256
#define RP_U 8
__global__ void __launch_bounds__(RP_THREADS) k_read_probe(const uint4 *__restrict__ p, size_t n16, uint32_t *sink)
{
    const size_t base = (size_t)blockIdx.x * RP_THREADS * RP_U + threadIdx.x;
    uint4 v[RP_U];
#pragma unroll
    for (int u = 0; u < RP_U; u++) {
        const size_t i = base + (size_t)RP_THREADS * u;
        v[u] = i < n16 ? p[i] : make_uint4(0, 0, 0, 0);
    }
    uint32_t acc = 0;
#pragma unroll
    for (int u = 0; u < RP_U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    fold_sink(acc, sink);
}

/* cuda_read_step's kernel: read_fold after an optional L2 prefetch of the
 * grid's bytes (each thread its lines, before the wait: a prefetch reads
 * nothing into the program, pdl_enter's contract). */
__global__ void k_read_step(const uint4 *__restrict__ p, size_t n16, uint32_t *sink, int prefetch)
{
    if (prefetch) {
        const size_t stride = (size_t)gridDim.x * blockDim.x;
        const uintptr_t b = (uintptr_t)p, end = b + 16 * n16;
        for (uintptr_t a = b + 128 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x); a < end; a += 128 * stride)
            asm volatile("prefetch.global.L2 [%0];\n" ::"l"(a));
    }
    pdl_enter();
    read_fold(p, n16, sink);
}

extern "C" int cuda_read_step(cuda_ctx *c, const void *buf, size_t bytes, uint32_t *sink, int prefetch, err *e)
{
    if (bytes % 16 || ((uintptr_t)buf & 15)) return err_setf(e, ERR_USAGE, "cuda_read_step: unaligned buffer or size");
    return cuda_launch(c, k_read_step, dim3((unsigned)(2 * c->info.sm_count)), dim3(512), 0, e, "read step",
                       (const uint4 *)buf, bytes / 16, sink, prefetch);
}

extern "C" int cuda_read_probe(cuda_ctx *c, const void *buf, size_t bytes, uint32_t *sink, err *e)
{
    if (bytes % 16 || ((uintptr_t)buf & 15)) return err_setf(e, ERR_USAGE, "cuda_read_probe: unaligned buffer or size");
    const size_t n16 = bytes / 16, per = (size_t)RP_THREADS * RP_U, blocks = (n16 + per - 1) / per;
    if (blocks == 0 || blocks > INT_MAX) return err_setf(e, ERR_USAGE, "cuda_read_probe: %zu bytes out of range", bytes);
    k_read_probe<<<(unsigned)blocks, RP_THREADS, 0, c->stream>>>((const uint4 *)buf, n16, sink);
    return cuda_launch_check(e, "read probe");
}

/* ==== The chain trace (cuda_internal.h, cuda_backend.h) ==== */
#ifdef STRATA_CUDA_TRACE
CUDA_TRACE_BIND(backend)
extern "C" int cuda_trace_bind_layer(void *p);
extern "C" int cuda_trace_bind_matvec(void *p);
extern "C" int cuda_trace_bind_ops(void *p);
extern "C" int cuda_trace_bind_step(void *p);
extern "C" int cuda_trace_bind_mmq(void *p);

/* Point every .cu file's ct_buf at p (NULL: recording off). */
static int trace_bind_all(void *p)
{
    return cuda_trace_bind_backend(p) | cuda_trace_bind_layer(p) | cuda_trace_bind_matvec(p) |
           cuda_trace_bind_ops(p) | cuda_trace_bind_step(p) | cuda_trace_bind_mmq(p);
}
#endif

extern "C" int cuda_trace_begin(cuda_ctx *c, int cap, err *e)
{
#ifdef STRATA_CUDA_TRACE
    cuda_trace_end(c);
    if (cap <= 0 || cap > (1 << 24)) return err_setf(e, ERR_USAGE, "cuda_trace_begin: cap %d out of range", cap);
    const size_t bytes = offsetof(cuda_trace_buf, rec) + sizeof(cuda_trace_rec) * (size_t)cap;
    c->tr_names = (const char **)calloc((size_t)cap, sizeof *c->tr_names);
    if (!c->tr_names) return err_setf(e, ERR_NOMEM, "cuda_trace_begin: out of memory");
    void *d = NULL;
    int r = cuda_fail(e, cudaMalloc(&d, bytes), "cuda_trace_begin: cudaMalloc");
    const unsigned int hdr[2] = { 0u, (unsigned int)cap };
    if (!r) r = cuda_fail(e, cudaMemset(d, 0, bytes), "cuda_trace_begin: cudaMemset");
    if (!r) r = cuda_fail(e, cudaMemcpy(d, hdr, sizeof hdr, cudaMemcpyHostToDevice), "cuda_trace_begin: cudaMemcpy");
    if (!r && trace_bind_all(d)) r = err_setf(e, ERR_INTERNAL, "cuda_trace_begin: binding the trace buffer failed");
    if (r) {
        trace_bind_all(NULL);
        cudaFree(d);
        free(c->tr_names);
        c->tr_names = NULL;
        return r;
    }
    c->tr_dev = (cuda_trace_buf *)d;
    c->tr_cap = cap;
    c->tr_nn = 0;
    return 0;
#else
    (void)c;
    (void)cap;
    return err_setf(e, ERR_UNSUPPORTED, "cuda_trace_begin: this build has no chain trace (make cuda CUDA_TRACE=1)");
#endif
}

extern "C" int cuda_trace_reset(cuda_ctx *c, err *e)
{
    if (!c->tr_dev) return err_setf(e, ERR_USAGE, "cuda_trace_reset: no trace begun");
    int r = cuda_fail(e, cudaStreamSynchronize(c->stream), "cuda_trace_reset: sync");
    if (!r) r = cuda_fail(e, cudaMemset(c->tr_dev, 0, sizeof(unsigned int)), "cuda_trace_reset: cudaMemset");
    if (!r) r = cuda_fail(e, cudaDeviceSynchronize(), "cuda_trace_reset: sync");
    c->tr_nn = 0;
    return r;
}

extern "C" int cuda_trace_read(cuda_ctx *c, uint64_t *t_enter, uint64_t *t_wait, int cap, int *n_rec,
                               const char *const **names, int *n_names, err *e)
{
    *n_rec = 0;
    *names = NULL;
    *n_names = 0;
    if (!c->tr_dev) return err_setf(e, ERR_USAGE, "cuda_trace_read: no trace begun");
    unsigned int seq = 0;
    int r = cuda_fail(e, cudaStreamSynchronize(c->stream), "cuda_trace_read: sync");
    if (!r) r = cuda_fail(e, cudaMemcpy(&seq, c->tr_dev, sizeof seq, cudaMemcpyDeviceToHost), "cuda_trace_read: copy");
    const int n = (int)(seq < (unsigned int)c->tr_cap ? seq : (unsigned int)c->tr_cap), m = n < cap ? n : cap;
    for (int i0 = 0; !r && i0 < m; i0 += 4096) {   /* through a bounded host buffer */
        cuda_trace_rec buf[4096];
        const int k = m - i0 < 4096 ? m - i0 : 4096;
        r = cuda_fail(e, cudaMemcpy(buf, c->tr_dev->rec + i0, sizeof(cuda_trace_rec) * (size_t)k, cudaMemcpyDeviceToHost),
                      "cuda_trace_read: copy");
        for (int i = 0; !r && i < k; i++) {
            t_enter[i0 + i] = buf[i].t_enter;
            t_wait[i0 + i] = buf[i].t_wait;
        }
    }
    if (r) return r;
    *n_rec = (int)(seq > (unsigned int)INT32_MAX ? INT32_MAX : seq);
    *names = c->tr_names;
    *n_names = c->tr_nn;
    return 0;
}

extern "C" void cuda_trace_end(cuda_ctx *c)
{
    if (!c->tr_dev) return;
#ifdef STRATA_CUDA_TRACE
    cudaStreamSynchronize(c->stream);
    trace_bind_all(NULL);
#endif
    cudaFree(c->tr_dev);
    free(c->tr_names);
    c->tr_dev = NULL;
    c->tr_names = NULL;
    c->tr_cap = c->tr_nn = 0;
}
