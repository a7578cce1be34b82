/* cuda_backend: the CUDA backend's public C interface (issue 9, first slice).
 *
 * What exists: a device context, device buffers, and the decode kernels for
 * one matvec layer type -- activation quantization, quantized matvec for
 * Q4_K / Q6_K / Q8_0 weights (one matrix or a batch of matrices, optionally
 * picked by a device array of expert ids), RMSNorm, SwiGLU and the MoE
 * router (softmax + top-k + renormalised weights). Built by `make cuda`
 * into build/cuda/libstrata_cuda.a; the CPU library never depends on it.
 *
 * Conventions
 *   - Every fallible function returns 0 or a negative ERR_* code (util/err.h)
 *     and fills `e` (NULL allowed). Nothing here exits or prints.
 *   - cuda_open() fails with ERR_UNSUPPORTED and a message naming the CUDA
 *     error when there is no GPU or no driver (cudaGetDeviceCount failing is
 *     an answer, not a crash); callers and tests use that to skip.
 *   - Pointers named "device" are device memory from cuda_alloc(); host
 *     pointers are plain memory.
 *   - STREAM: each context owns ONE internal CUDA stream. Every kernel call
 *     below is only ENQUEUED on it (asynchronous, executed in call order);
 *     cuda_upload() and cuda_download() are synchronous (download first
 *     waits for all queued work); cuda_sync() waits for the queue. Errors
 *     of an asynchronous kernel surface at the next synchronising call.
 *     Later slices add explicit streams for copy/compute overlap.
 *   - Numerics: the device reproduces the CPU path (quant/quant.h, model/ops.h)
 *     as far as stated per function; where only float summation order
 *     differs, the tests compare with a stated tolerance.
 *
 * Not thread-safe: one context per host thread (or external locking). */
#ifndef STRATA_CUDA_BACKEND_H
#define STRATA_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "util/err.h"

typedef struct cuda_ctx cuda_ctx;   /* opaque */

typedef struct cuda_info {
    char     name[256];        /* "NVIDIA H200" (cudaDeviceProp.name size) */
    int      device;           /* CUDA ordinal */
    int      cc_major, cc_minor;
    int      sm_count;
    size_t   global_mem;       /* bytes */
    size_t   l2_bytes;
    size_t   smem_per_block_optin; /* the most dynamic shared memory a block may get */
    int      runtime_version, driver_version;   /* e.g. 13000 */
} cuda_info;

/* Open GPU `device` (0 for the first). ERR_UNSUPPORTED when there is no
 * driver or GPU (the message carries the CUDA error string), when `device`
 * is out of range, or when the GPU is older than compute capability 9.0
 * (the build holds sm_90 code and compute_90 PTX only). */
int  cuda_open(cuda_ctx **out, int device, err *e);
/* Waits for queued work, frees the stream and the context (not the buffers
 * the caller allocated: free those first). NULL is a no-op. */
void cuda_close(cuda_ctx *c);
const char *cuda_device_name(const cuda_ctx *c);
const cuda_info *cuda_get_info(const cuda_ctx *c);

/* ==== Buffers ==== */
int  cuda_alloc(cuda_ctx *c, void **dptr, size_t bytes, err *e);   /* cudaMalloc: 256-byte aligned */
void cuda_free(cuda_ctx *c, void *dptr);                            /* NULL is a no-op */
int  cuda_upload(cuda_ctx *c, void *dst_dev, const void *src_host, size_t bytes, err *e);
int  cuda_download(cuda_ctx *c, void *dst_host, const void *src_dev, size_t bytes, err *e);
int  cuda_memset(cuda_ctx *c, void *dst_dev, int byte, size_t bytes, err *e);   /* enqueued */
int  cuda_copy_d2d(cuda_ctx *c, void *dst_dev, const void *src_dev, size_t bytes, err *e); /* enqueued */
int  cuda_sync(cuda_ctx *c, err *e);
/* Page-lock host memory for fast copies (cudaHostRegister) over the
 * page-aligned span around [p, p + bytes); read_only: the device only reads
 * it (a PROT_READ file mapping qualifies only so). ERR_UNSUPPORTED when the
 * device or system refuses (the caller copies from pageable memory
 * instead: the same bytes, slower). Unregister (same p) before the memory
 * goes away. */
int  cuda_host_register(cuda_ctx *c, const void *p, size_t bytes, int read_only, err *e);
void cuda_host_unregister(cuda_ctx *c, const void *p);
/* Page-locked host buffers (cudaMallocHost), for benchmarks' pinned copies. */
int  cuda_host_alloc(cuda_ctx *c, void **p, size_t bytes, err *e);
void cuda_host_free(cuda_ctx *c, void *p);   /* NULL is a no-op */

/* ==== The copy stream ====
 * A second stream for host -> device copies, so that copies run while the
 * compute stream works. cuda_copy_h2d enqueues one copy there (returns at
 * once when src is page-locked; from pageable memory the runtime stages it
 * and may return only when the staging is done). cuda_copy_fence makes
 * the compute stream's later work wait for every copy enqueued so far (an
 * event, no host wait). cuda_copy_wait blocks the host until the copy
 * stream is idle (before the source memory may change). The copy stream
 * never waits for the compute stream: a caller that overwrites device
 * memory a kernel may still read must have synchronized with the compute
 * stream since that kernel was enqueued. */
int  cuda_copy_h2d(cuda_ctx *c, void *dst_dev, const void *src_host, size_t bytes, err *e);
int  cuda_copy_fence(cuda_ctx *c, err *e);
int  cuda_copy_wait(cuda_ctx *c, err *e);

/* ==== Timing (benchmarks) ====
 * timer_begin records an event on the stream; timer_end records a second,
 * waits for it and returns the milliseconds between them. */
int  cuda_timer_begin(cuda_ctx *c, err *e);
int  cuda_timer_end(cuda_ctx *c, float *ms, err *e);
/* A read-only bandwidth probe: every byte of buf[0..bytes) is read once with
 * 16-byte loads (a CTA a contiguous 32 KB chunk, a thread's 8 loads in
 * flight together: the fastest read pattern measured) and folded into
 * *sink_dev (one uint32, device) so the loads cannot be dropped. bytes must
 * be a multiple of 16 (at most 2^31 chunks), buf 16-byte aligned. */
int  cuda_read_probe(cuda_ctx *c, const void *buf_dev, size_t bytes, uint32_t *sink_dev, err *e);
/* The same read as one kernel of a dependent chain: launched as a
 * programmatic dependent of the previous kernel (as the decode graph's
 * kernels are), 2 CTAs of 512 threads an SM, so that a chain of them in a
 * graph times dependent reads of a token's step sizes (test_cuda
 * --bench-chain). prefetch: each CTA first asks L2 for its share of the
 * bytes, before its dependency wait (as the dense matvecs do). */
int  cuda_read_step(cuda_ctx *c, const void *buf_dev, size_t bytes, uint32_t *sink_dev, int prefetch, err *e);
/* The latency of one dependent step, the floor under a chain of kernels
 * that each need the one before: `steps` links, each a launch of `ctas`
 * CTAs of 256 threads as a programmatic dependent of the previous (as the
 * decode graph runs its kernels), whose CTAs read the previous link's value
 * and whose CTA 0 writes the next; or (mode 1, persistent) one grid of
 * `ctas` resident CTAs passing `steps` grid-wide barriers with the same
 * dependency; or (mode 2, tickets) the launches of mode 0 where a link
 * does not wait for the previous grid's completion (griddepcontrol.wait)
 * before its work but for the previous link's ticket: each CTA of a link,
 * after its stores, adds 1 (release) to the next link's ticket, and the
 * next link's CTAs spin (acquire) until it reaches the previous link's CTA
 * count, then let their dependents launch; griddepcontrol.wait comes only
 * before a CTA exits, which keeps the transitive guarantee for whatever
 * follows the chain. Captured as one graph (mode 2: the tickets zeroed
 * first), replayed 6 times: *us = the best replay's microseconds a step. */
int  cuda_step_probe(cuda_ctx *c, int ctas, int mode, int steps, float *us, err *e);

/* ==== The chain trace (bench/cuda/trace.sh) ====
 * Only in a build with STRATA_CUDA_TRACE (make cuda CUDA_TRACE=1);
 * elsewhere begin fails with ERR_UNSUPPORTED and the others do nothing.
 * From cuda_trace_begin on, the first thread of CTA 0 of every kernel
 * records two %globaltimer readings (nanoseconds): when it entered
 * pdl_enter and when its dependency wait returned, in launch order (see
 * cuda_internal.h); and every launch enqueued through this context (a
 * graph capture included; replays launch nothing here) records its name.
 * cap: records and names kept (the counts go on past it).
 * cuda_trace_read syncs the stream and copies min(*n_rec, cap) records
 * (t_enter[i], t_wait[i]) out; *n_rec is the count taken so far, names
 * (*names, valid until the next begin or end) the launch names, *n_names
 * their count. cuda_trace_reset zeroes both counts; cuda_trace_end stops
 * recording and frees the buffers. */
int  cuda_trace_begin(cuda_ctx *c, int cap, err *e);
int  cuda_trace_reset(cuda_ctx *c, err *e);
int  cuda_trace_read(cuda_ctx *c, uint64_t *t_enter, uint64_t *t_wait, int cap, int *n_rec, const char *const **names,
                     int *n_names, err *e);
void cuda_trace_end(cuda_ctx *c);

/* ==== CUDA graphs: capture a sequence of enqueued calls, replay it ====
 * cuda_graph_begin starts capturing the context's stream (thread-local
 * capture mode): every enqueued call after it (kernels, cuda_memset,
 * cuda_copy_d2d) is recorded, not run, until cuda_graph_end, which ends the
 * capture and instantiates the recorded work into *g (NULL on failure).
 * Synchronous calls (cuda_upload, cuda_download, cuda_sync, the timers) are
 * not allowed while capturing: they fail and invalidate the capture. After
 * a failed call inside a capture, still call cuda_graph_end (it ends the
 * capture, returns the error and frees what was recorded) before using the
 * context again. cuda_graph_launch enqueues one replay of g on the stream
 * (asynchronous, like a kernel); the replay reads and writes exactly the
 * device pointers captured, so anything that changes per replay must live
 * in device memory the graph itself reads (e.g. a position slot).
 * cuda_graph_free: NULL is a no-op; the graph must not be running (sync
 * first). */
typedef struct cuda_graph cuda_graph;   /* opaque */
int  cuda_graph_begin(cuda_ctx *c, err *e);
int  cuda_graph_end(cuda_ctx *c, cuda_graph **g, err *e);
int  cuda_graph_launch(cuda_ctx *c, cuda_graph *g, err *e);
void cuda_graph_free(cuda_graph *g);
/* Kernel nodes of g (a decode row's graph: its dependent steps), -1 on error. */
int  cuda_graph_kernels(const cuda_graph *g);

/* ==== Activation quantization ====
 * The matvec for weight type wtype reads its input already quantized to the
 * weight's dot type (qtype dot_type), as the CPU does: Q8_K for
 * Q4_K/Q5_K/Q6_K, Q8_0 for Q8_0/Q4_0/Q5_0, Q8_1 for Q4_1/Q5_1, f16 for
 * F16, bf16 for BF16, f32 for F32. cuda_act_bytes: bytes of one quantized
 * row of n elements for weights of type wtype; 0 if wtype is unsupported
 * or n is not a whole number of blocks (float types: any n > 0).
 *
 * cuda_act_quant quantizes `rows` rows of n floats (x, row-major) into xq
 * (rows * cuda_act_bytes(wtype, n) bytes, rows back to back), BIT-IDENTICAL
 * to the CPU's act_quant of the dot type (quant_ref_quant_q8_K: first
 * largest |x| sets the sign of the scale, nearest-even, q <= 127;
 * quant_ref_act_quant_q8_0: q = round-half-even(x * (127/amax)), d =
 * half(amax/127); quant_ref_act_quant_q8_1: the same d and qs, s =
 * half(d * (float)sum), sum the wrapping int32 sum of the unsaturated
 * conversions; f16 / bf16: fp32_to_fp16 / fp32_to_bf16, round to
 * nearest even, inf/NaN as those; f32: a copy). Q8 inputs must be finite.
 * Enqueued. */
size_t cuda_act_bytes(int wtype, int64_t n);
int  cuda_act_quant(cuda_ctx *c, int wtype, const float *x_dev, void *xq_dev, int64_t n, int rows, err *e);
/* cuda_act_quant of h = swiglu(g, u) (cuda_swiglu's h, bit for bit)
 * without writing h: the down projection's input in one launch. Only the
 * quantized dot types (Q8_K, Q8_0, Q8_1); float dot types answer
 * ERR_UNSUPPORTED (the caller runs cuda_swiglu, then cuda_act_quant). */
/* cuda_rmsnorm_quant: cuda_rmsnorm of one row of n floats into y (y may
 * alias x), then cuda_act_quant of y, in one launch, bit for bit the two
 * calls. Quantized dot types and n <= CUDA_RMSQ_MAXN only (else
 * ERR_UNSUPPORTED: the row is staged in shared memory). */
#define CUDA_RMSQ_MAXN 8192
int  cuda_rmsnorm_quant(cuda_ctx *c, int wtype, float *y_dev, void *xq_dev, const float *x_dev, const float *w_dev,
                        int n, float eps, err *e);
/* cuda_moe_combine_rmsnorm_quant: cuda_moe_combine of one row (rows 1:
 * x += the weighted sum of the k rows of n floats at eout, weights[0..k))
 * then cuda_rmsnorm_quant of the new x (norm weights w) into y and xq, in
 * one launch -- a decode layer's last step and the next norm (the next
 * layer's attention input, or the output norm before the head) -- bit for
 * bit the two calls: x, y and xq. y may alias x (x then ends as the normed
 * row, as the two calls leave it); eout and weights must not overlap x, y
 * or xq. Types and n as cuda_rmsnorm_quant (else ERR_UNSUPPORTED); k < 1
 * or n < 1, or x or eout not 16-byte aligned (cuda_alloc's are): ERR_USAGE.
 * Enqueued. */
int  cuda_moe_combine_rmsnorm_quant(cuda_ctx *c, int wtype, float *x_dev, const float *eout_dev,
                                    const float *weights_dev, int k, float *y_dev, void *xq_dev, const float *w_dev,
                                    int n, float eps, err *e);
int  cuda_act_quant_swiglu(cuda_ctx *c, int wtype, const float *g_dev, const float *u_dev, void *xq_dev, int64_t n,
                           int rows, err *e);

/* ==== Quantized matvec (Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q5_0, Q4_1, Q5_1,
 *      F32, F16, BF16) ====
 * For b in [0, n_batch): matrix m = ids ? ids[b] : b, whose `rows` rows of k
 * weights lie back to back at w + m * w_stride (ggml row layout, rows of
 * k/blck blocks); input row xb at xq + b * x_stride (already quantized by
 * cuda_act_quant for this wtype; x_stride 0 = every b shares one row);
 * output y[b * y_stride + r] = dot(row r of matrix m, xb) for r < rows.
 * Optional: w2 (with y2): a second matrix set of the same type, shape,
 * stride and ids computed in the same launch from the same inputs (gate
 * and up), outputs to y2 as y; add: y[o] = dot + add[o] (the residual;
 * add may be y itself; not with w2). NULL when unused. n_batch <= 32767
 * with w2.
 *
 * Per block the arithmetic is the CPU dot's (quant_ref_dot_*): integer
 * products and sums per (sub-)block, then float scaling with the same
 * factors (d_w * d_x, and dmin_w * d_x for the Q4_K/Q5_K mins; Q4_1/Q5_1
 * add m_w * s_x a block). Float weights: the CPU's float products (exact
 * for f16 and bf16), summed in float instead of double. Blocks are split
 * across a warp and summed in a different order than the CPU's, so results
 * agree up to float rounding (tests: NMSE < 1e-10).
 *
 * Alignment: w (and w_stride) 16-byte aligned for Q4_K, Q5_K, F32, F16,
 * BF16; 2-byte for Q6_K / Q8_0 / Q4_0 / Q5_0 / Q4_1 / Q5_1 (any row
 * size: the kernel stages whole tiles with 16-byte copies and copies the
 * unaligned ends byte-wise). xq (and x_stride): 4-byte aligned for Q8_K,
 * 2 for Q8_0 and Q8_1, 16 for f32/f16/bf16 activations. GGUF tensor data
 * is 32-byte aligned.
 * ids: device int32, each in [0, number of matrices): not checked.
 * Limits: k a multiple of 256 (K-quants), 32 (Q8_0, Q4_0, Q5_0, Q4_1,
 * Q5_1), 4 (F32) or 8 (F16, BF16); one row of weights (tiles shrink to 1
 * row when 4 rows exceed 64 KB) plus the unpacked activation must fit in
 * the device's shared memory (k up to about 100000 for Q8_0, 58000 for F32). Enqueued. */
typedef struct cuda_matvec_args {
    int            wtype;     /* QTYPE_Q4_K/Q5_K/Q6_K/Q8_0/Q4_0/Q5_0/Q4_1/Q5_1/F32/F16/BF16 (qtype.h ids),
                                 or CUDA_Q8_0_SPLIT (below) */
    const void    *w;         /* device */
    size_t         w_stride;  /* bytes from matrix m to m + 1 */
    const int32_t *ids;       /* device, n_batch entries, or NULL */
    int64_t        rows, k;
    int            n_batch;   /* >= 1, <= 65535 */
    const void    *xq;        /* device */
    size_t         x_stride;  /* bytes; 0 = shared input */
    float         *y;         /* device */
    size_t         y_stride;  /* floats */
    const void    *w2;        /* device, or NULL: a second matrix set (see above) */
    float         *y2;        /* device: w2's outputs, laid out as y */
    const float   *add;       /* device, or NULL: y = dot + add (same indexing as y) */
    int            ids_early; /* ids were written by a kernel two or more launches
                                 before this one on the stream (or before a copy):
                                 the direct kernel reads them, and prefetches the
                                 rows they pick into L2, before its dependency wait */
    int            xquant;    /* 0: xq holds rows quantized by cuda_act_quant.
                                 CUDA_XQ_F32: xq holds f32 rows and each CTA
                                 quantizes its row itself, bit for bit what
                                 cuda_act_quant writes; CUDA_XQ_SWIGLU: xq holds
                                 f32 g rows and xu the u rows (the same x_stride),
                                 the CTA quantizes swiglu(g, u), bit for bit
                                 cuda_act_quant_swiglu. Only weight types whose
                                 dot type is Q8_K or Q8_0 (cuda_matvec_xquant_ok);
                                 x_stride a multiple of 16 bytes, xq and xu 16-byte
                                 aligned. One dependent launch fewer on the token
                                 path (the quantizer's). CUDA_XQ_NORM: xq holds
                                 one f32 row x (x_stride 0) and the CTA computes
                                 rms(x) * xnw (eps) itself, bit for bit
                                 cuda_rmsnorm (then quantizes it as
                                 cuda_rmsnorm_quant does); also F32 weights, whose
                                 dots then read the normed row from shared
                                 memory (cuda_matvec_xnorm_ok). The direct kernel
                                 only (the tile kernel has too few threads for
                                 the norm's reduction tree). */
    const float   *xu;
    const float   *xnw;       /* CUDA_XQ_NORM: the norm's k weights */
    float          eps;       /* CUDA_XQ_NORM: its epsilon */
    int            x_early;   /* xq's row (a CUDA_XQ_NORM row, or a plain one of
                                 a Q8_K / Q8_0 dot type; ignored otherwise) was
                                 written two or more launches before this one
                                 (or before a copy): the CTA unpacks (or norms
                                 and quantizes) it before its dependency wait,
                                 off the chain's critical path */
    void          *nq_out;    /* CUDA_XQ_NORM, or NULL: the normed row also
                                 quantized for weight type nq_type (a Q8_K or
                                 Q8_0 dot type: cuda_matvec_xquant_ok) to
                                 nq_out, bit for bit cuda_rmsnorm_quant's xq,
                                 by the launch's warps a block each (the F32
                                 router's CTAs hand gate+up its input so) */
    int            nq_type;
} cuda_matvec_args;
#define CUDA_XQ_F32    1
#define CUDA_XQ_SWIGLU 2
#define CUDA_XQ_NORM   3
/* Whether cuda_matvec_args.xquant applies to weight type wtype (a
 * cuda_matvec wtype): its dot type is Q8_K or Q8_0. The row is quantized
 * into the shared memory its unpacked form takes, so any k the plain
 * launch takes. */
int  cuda_matvec_xquant_ok(int wtype);
/* Whether CUDA_XQ_NORM applies to wtype: cuda_matvec_xquant_ok, or F32. */
int  cuda_matvec_xnorm_ok(int wtype);
/* The decode attention's phases in a CUDA_TRACE=1 build (its CTA 0, the
 * spread path): mean µs entry -> wait return, -> prologue done, -> tile
 * loop done, -> cluster sends done, -> the merge received (its mbarrier), -> output stored,
 * over *n launches since the last call (then cleared). Else ERR_UNSUPPORTED. */
int  cuda_attention_probe(cuda_ctx *c, double us[6], unsigned *n, err *e);

int  cuda_matvec_batch(cuda_ctx *c, const cuda_matvec_args *a, err *e);
/* Which matvec kernel cuda_matvec_batch launches: 0 (the default) and 2
 * the direct kernel, 1 the tile kernel (cuda_matvec.cu says why). For
 * benchmarks that compare the two on a whole model (test_cuda_model
 * --bench); results differ only in float summation order. Mode 2 also
 * keeps cuda_matmul on its dp4a kernel where it would take the tensor
 * cores (cuda_mmq.cu; the same results bit for bit). */
void cuda_matvec_force(cuda_ctx *c, int mode);
/* Kernels launched as programmatic dependents of the stream's previous
 * kernel (Hopper's PDL: a kernel's launch overlaps the previous one's
 * tail; cuda_internal.h states the contract). On by default; off only for
 * benchmarks that measure what it gives (test_cuda_model --bench).
 * Results are identical either way. Graphs captured before a change keep
 * the setting they were captured with. */
void cuda_set_pdl(cuda_ctx *c, int on);

/* cuda_matmul: the grouped form of cuda_matvec_batch for prompt chunks.
 * Item b multiplies matrix ids[b] (ids NULL: matrix 0) of the stack w
 * (rows x k, stride w_stride) by up to CUDA_MM_NB activation rows:
 * xrow[b * CUDA_MM_NB + j] (-1 ends the item's list; at least one) is the
 * index of an activation row at xq + xrow * x_stride, and its rows outputs
 * go to y[yoff[b * CUDA_MM_NB + j] + r], r < rows. The weights of an item
 * are read once for all its rows (the point: a chunk's rows routed to one
 * expert, or the rows of a dense projection). Each output is bit for bit
 * what cuda_matvec_batch (the direct kernel) gives for that matrix and row:
 * the same items, the same per-lane order, the same reduction (Q4_K, Q5_K,
 * Q6_K and split Q8_0 on sm_80+, the shapes cuda_mmq.cu takes: its
 * tensor-core kernels, their integer dots by int8 mma, summed in that
 * same order). Types and
 * alignment as cuda_matvec_batch; n_items <= 65535. Enqueued. */
#define CUDA_MM_NB 8
typedef struct cuda_matmul_args {
    int            wtype;
    const void    *w;
    size_t         w_stride;
    const int32_t *ids;       /* device (n_items) or NULL */
    int64_t        rows, k;
    int            n_items;
    const void    *xq;        /* device */
    size_t         x_stride;
    const int32_t *xrow;      /* device (n_items, CUDA_MM_NB) */
    const int64_t *yoff;      /* device (n_items, CUDA_MM_NB) */
    float         *y;         /* device */
} cuda_matmul_args;
int  cuda_matmul(cuda_ctx *c, const cuda_matmul_args *a, err *e);
/* Q8_0 matrices in split rows: cuda_repack_q8_0 rewrites, in place, each
 * of `rows` rows of k weights (k a multiple of 256, so that every row of
 * 34 k / 32 bytes stays 16-byte aligned; w 16-byte aligned) as its k int8
 * quants followed by its k / 32 f16 scales. cuda_matvec, cuda_matvec_batch
 * and cuda_matmul take such a matrix as wtype CUDA_Q8_0_SPLIT (with Q8_0's
 * activations: cuda_act_quant with QTYPE_Q8_0) and give bit for bit what
 * the Q8_0 rows give, with a 16-byte load where Q8_0's 2-byte-aligned
 * blocks need eight. Not a ggml type: nothing else reads such rows.
 * Enqueued. */
#define CUDA_Q8_0_SPLIT 1008
int  cuda_repack_q8_0(cuda_ctx *c, void *w_dev, int64_t rows, int64_t k, err *e);
/* One matrix: y[r] = dot(row r of w, xq) for r < rows. */
int  cuda_matvec(cuda_ctx *c, int wtype, const void *w_dev, int64_t rows, int64_t k, const void *xq_dev,
                 float *y_dev, err *e);
/* Two matrices of two types on one activation row in one launch (one
 * dependent phase where two cuda_matvec launches take two): s[0].y[r] =
 * dot(row r of s[0].w, xq), likewise s[1], both rows of k weights, each
 * output bit for bit its own cuda_matvec's. The types must share their
 * activation blocks: cuda_matvec_pair_ok (Q4_K or Q5_K, then Q6_K: a
 * Q4_K_M / Q5_K_M file's q+k, then the attn_v llama-quantize gives Q6_K
 * in half the layers); others ERR_UNSUPPORTED. Enqueued. */
typedef struct cuda_matvec_seg {
    int         wtype;
    const void *w;      /* device */
    int64_t     rows;
    float      *y;      /* device */
} cuda_matvec_seg;
int  cuda_matvec_pair_ok(int wtype_a, int wtype_b);
int  cuda_matvec_pair(cuda_ctx *c, const cuda_matvec_seg s[2], int64_t k, const void *xq_dev, err *e);

/* ==== Float row ops (ops.h numerics) ====
 * cuda_rmsnorm: `rows` rows of n floats (stride n): y = (x * scale) * w,
 *   scale = 1/sqrtf((float)(sum x*x / n) + eps), the products in float and
 *   the sum in double as ops_rmsnorm (tree order instead of serial: equal
 *   up to the last bit of the mean). y may alias x. Enqueued.
 * cuda_swiglu: h[i] = g[i] / (1 + expf(-g[i])) * u[i] (CUDA's expf is
 *   within 2 ulp of glibc's). h may alias g or u. Enqueued.
 * cuda_router_topk: for each of `rows` rows of n_expert logits: softmax as
 *   ops_softmax (max subtraction, expf, double sum, times (float)(1/sum)),
 *   the k largest probabilities in descending order, ties to the lower
 *   index (ops_topk), ids[r*k + t]; weights[r*k + t] = p / max(sum of the
 *   k chosen p (double, then float), 2^-14) as qwen3moe.c route(). The
 *   logits are not modified. n_expert <= 1024, 1 <= k <= 32, k <= n_expert.
 *   Enqueued. */
int  cuda_rmsnorm(cuda_ctx *c, float *y_dev, const float *x_dev, const float *w_dev, int n, int rows, float eps,
                  err *e);
int  cuda_swiglu(cuda_ctx *c, float *h_dev, const float *g_dev, const float *u_dev, int64_t n, err *e);
int  cuda_router_topk(cuda_ctx *c, const float *logits_dev, int n_expert, int k, int rows, int32_t *ids_dev,
                      float *weights_dev, err *e);

/* ==== The rest of the decode token path (cuda_layer.cu) ====
 * Each function is enqueued on the context's stream and reproduces the CPU
 * function named (model/ops.h, quant/quant.h, qwen3moe.c) as stated; none
 * reads host memory, so a whole token runs without a host round trip.
 *
 * cuda_get_rows: out[r][0..n) = dequant(row ids[r] of w) for r < rows,
 *   w a (n_rows_w, n) matrix of type wtype, row stride row_bytes (>= the
 *   type's row size; any alignment). Types: F32, F16, BF16, Q4_0, Q4_1,
 *   Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (else ERR_UNSUPPORTED).
 *   ids a device int32 array (values checked against n_rows_w on the
 *   device: an id out of range writes zeros and sets *bad_dev (device
 *   int32, may be NULL; never cleared) to 1). rows <= 65535.
 *   Bit-identical to quant_dequantize (quant_ref.c), NaN halves included.
 * cuda_rope_neox: x holds `rows` rows of n_head heads of head_dim floats
 *   (row stride n_head*head_dim); row r at position pos_dev[r] (device
 *   int32) is rotated in place by the NeoX RoPE of ops_rope_cache +
 *   ops_rope_neox over the first n_rot dims (n_rot even, <= head_dim,
 *   <= 1024). theta_scale = powf(base, -2.0f/n_rot) is computed on the
 *   host (the CPU's bits), theta is the CPU's chain of float products,
 *   the rotation the CPU's rounded products and sums; only cos/sin differ:
 *   the device rounds a double sincos (correctly rounded), glibc's
 *   cosf/sinf are within 1 ulp of that. So outputs are bit-identical where
 *   cos/sin agree and within 2.5e-7 * (|x0| + |x1|) everywhere.
 * cuda_kv_store: writes rows of kvd floats from src into the cache at
 *   rows pos_dev[0] .. pos_dev[0]+rows-1 (cache row stride kvd), as f16
 *   (fp32_to_fp16: round to nearest even, NaN payloads, bit-identical)
 *   when f16 else f32. The caller keeps pos + rows within the cache.
 * cuda_attention_decode: for each of n_q query rows i (query row stride
 *   n_head*head_dim, at position pos_dev[0] + i) and each head h (kv head
 *   h / (n_head/n_head_kv)), out = softmax(scale * q.K^T) V over cache
 *   positions 0..pos+i (causal), K/V caches f16 or f32 with row stride
 *   n_head_kv*head_dim, as ops_attention (float dots, softmax with max
 *   subtraction, expf): dots, exps and sums in other orders (online
 *   softmax split over warps and a cluster of CTAs), so per element
 *   |gpu - cpu| <= 1e-5 * sum_j p_j |v_j[d]| (relative to the terms summed;
 *   an output can cancel to ~0, where plain relative error means nothing).
 *   Output rows have q's layout; out may be q itself (in place), else the
 *   two must not overlap. head_dim a multiple of 8, <= 256; n_head a
 *   multiple of n_head_kv; n_q <= 65535; k/v 16-byte aligned (cuda_alloc);
 *   positions up to the cache size (any n_ctx; no scratch memory).
 * cuda_moe_combine: for each row r < rows: x[r] += sum over t < k, in
 *   order t = 0..k-1 ((e0 + e1) + e2 ...), of weights[r*k+t] *
 *   eout[(r*k+t)][0..n) (eout rows back to back, n floats each) -- the
 *   weighted sum first, then added to the residual, as qwen3moe.c does;
 *   bit-identical given the same inputs (plain float ops, no FMA
 *   contraction). One row followed by an RMSNorm in one launch:
 *   cuda_moe_combine_rmsnorm_quant (above).
 * cuda_add: y[i] = a[i] + b[i] for i < n (y may alias a or b).
 * cuda_argmax: out_dev[r] = the CPU greedy sampler's pick for row r's n
 *   floats (rows back to back): the lowest index of the largest value,
 *   NaN never chosen over a number -- except that, as the CPU scan starts
 *   at index 0 and moves only to a strictly greater value, a NaN at index
 *   0 answers 0 (and so does a row of NaNs). rows <= 65535, n < 2^31. */
int  cuda_get_rows(cuda_ctx *c, int wtype, const void *w_dev, size_t row_bytes, int64_t n_rows_w, int64_t n,
                   const int32_t *ids_dev, int rows, float *out_dev, int32_t *bad_dev, err *e);
int  cuda_rope_neox(cuda_ctx *c, float *x_dev, int rows, int n_head, int head_dim, int n_rot,
                    const int32_t *pos_dev, float freq_base, float freq_scale, err *e);
int  cuda_kv_store(cuda_ctx *c, void *cache_dev, int f16, const float *src_dev, int rows, int64_t kvd,
                   const int32_t *pos_dev, err *e);
/* cuda_qk_norm_rope_store: one decode row's attention prologue in one
 *   launch, bit for bit the sequence cuda_rmsnorm(q, per head, q_norm),
 *   cuda_rmsnorm(k, per head, k_norm), cuda_rope_neox(q and k at
 *   pos_dev[0]), cuda_kv_store(k), cuda_kv_store(v): q (n_head heads) and
 *   k (n_head_kv heads) are normed and rotated in place, k and v written
 *   to the caches (row stride n_head_kv*head_dim, f16 when f16). */
int  cuda_qk_norm_rope_store(cuda_ctx *c, float *q_dev, float *k_dev, const float *v_dev, const float *q_norm_dev,
                             const float *k_norm_dev, int n_head, int n_head_kv, int head_dim, int n_rot,
                             const int32_t *pos_dev, float freq_base, float freq_scale, float eps, void *k_cache_dev,
                             void *v_cache_dev, int f16, err *e);
/* Caps the attention kernels' cluster size (0: the largest the device
 * allows, the default) for benchmarks comparing sizes; results differ only
 * in the merge's summation order. */
void cuda_attention_force_cluster(cuda_ctx *c, int n);
/* Sets the decode attention's query heads a CTA (1, 2, 4 or 8, used when
 * it divides the group; 0: the heuristic, the default) for benchmarks;
 * results differ only in summation order. */
void cuda_attention_force_heads(cuda_ctx *c, int gb);
/* on: cuda_attention_rows launches k_attn's one-row shape for each bucket
 * (the kernel it replaced, for benchmarks and tests); off (the default):
 * one CTA per (row, KV head) where the shape allows. The same bits. */
void cuda_attention_force_one_row(cuda_ctx *c, int on);
int  cuda_attention_decode(cuda_ctx *c, float *out_dev, const float *q_dev, int n_q, int n_head, int n_head_kv,
                           int head_dim, const void *k_dev, int k_f16, const void *v_dev, int v_f16,
                           const int32_t *pos_dev, int n_kv_max, float scale, err *e);
/* The decode attention's launch shape follows the context: n_kv_max (the
 * attention calls' argument, a bound on pos + 1 of the rows, known to the
 * caller when it launches or captures) picks a bucket,
 * cuda_attention_bucket(n_kv_max) = 0, 1, 2 for contexts up to
 * cuda_attention_bucket_end(0) = 128, up to _end(1) = 2048, and longer
 * (_end(2) = INT_MAX), and the bucket the cluster size (4, 8, 16 CTAs;
 * then the heads a CTA). Any bound computes every row correctly (within
 * the tolerance above); rows agree bit for bit with each other only
 * when their calls' bounds are in the same bucket, so a caller passes a
 * bound of the bucket of pos + 1 (a graph serves one bucket). */
#define CUDA_ATTN_BUCKETS 3
int  cuda_attention_bucket(int n_kv);
int  cuda_attention_bucket_end(int bucket);
/* cuda_qk_norm_rope_store_rows: cuda_qk_norm_rope_store for `rows` rows
 * at once (a prompt chunk): row r's q at q + r * n_head*head_dim, its k and
 * v at k / v + r * n_head_kv*head_dim, its position pos_dev[r]; each row
 * bit for bit the one-row call. rows <= 65535. */
int  cuda_qk_norm_rope_store_rows(cuda_ctx *c, float *q_dev, float *k_dev, const float *v_dev, int rows,
                                  const float *q_norm_dev, const float *k_norm_dev, int n_head, int n_head_kv,
                                  int head_dim, int n_rot, const int32_t *pos_dev, float freq_base, float freq_scale,
                                  float eps, void *k_cache_dev, void *v_cache_dev, int f16, err *e);
/* cuda_attention_rows: cuda_attention_decode for n_q rows, each row's
 * output bit for bit what a one-row call at its position p gives with a
 * bound of the bucket of p + 1 (a prompt chunk's attention, equal to the
 * decode path's): one launch per bucket the rows' contexts fall in, of a
 * CTA per (row, KV head) that repeats the one-row launch's operations in
 * its order (head_dim 64 or 128, both caches f16 or both f32, groups of up
 * to 8 heads), else of the one-row launch shape itself. pos0 is the
 * host's copy of pos_dev[0] (row i at position pos0 + i). */
int  cuda_attention_rows(cuda_ctx *c, float *out_dev, const float *q_dev, int n_q, int n_head, int n_head_kv,
                         int head_dim, const void *k_dev, int k_f16, const void *v_dev, int v_f16,
                         const int32_t *pos_dev, int pos0, float scale, err *e);
/* cuda_attention_decode_fused: one decode row's cuda_qk_norm_rope_store
 * and cuda_attention_decode (n_q = 1, both caches f16 when f16) in one
 * launch, bit for bit the two calls' output and caches, except that q, k
 * and v (the raw q/k/v matvec rows) are only read: the normed, rotated q
 * and k are never written back. Each attention CTA norms and rotates its
 * own query heads; the CTA whose slice of positions holds the row's
 * position builds its KV head's new K and V rows in shared memory (one
 * CTA a KV head stores them). So the attention follows the q/k/v matvec
 * with no launch between. out must not overlap q, k or v. */
int  cuda_attention_decode_fused(cuda_ctx *c, float *out_dev, const float *q_dev, const float *k_dev,
                                 const float *v_dev, const float *q_norm_dev, const float *k_norm_dev, int n_head,
                                 int n_head_kv, int head_dim, int n_rot, const int32_t *pos_dev, float freq_base,
                                 float freq_scale, float eps, void *k_cache_dev, void *v_cache_dev, int f16,
                                 int n_kv_max, float scale, err *e);
int  cuda_moe_combine(cuda_ctx *c, float *x_dev, const float *eout_dev, const float *weights_dev, int rows, int k,
                      int64_t n, err *e);
int  cuda_add(cuda_ctx *c, float *y_dev, const float *a_dev, const float *b_dev, int64_t n, err *e);

int  cuda_argmax(cuda_ctx *c, int32_t *out_dev, const float *x_dev, int rows, int64_t n, err *e);

/* ==== Decode step bookkeeping (cuda_step.cu) ====
 * cuda_step_advance: one thread: p = *pos_slot; tok_hist[p + 1] =
 *   *tok_slot; *pos_slot = p + 1. With the argmax written to tok_slot and
 *   every kernel of a step reading its token and position from tok_slot and
 *   pos_slot, a decode step is the same sequence of calls every time (one
 *   captured graph replays it). tok_hist needs p + 2 entries; the caller
 *   keeps p within it. Enqueued. */
int  cuda_step_advance(cuda_ctx *c, int32_t *tok_slot_dev, int32_t *pos_slot_dev, int32_t *tok_hist_dev, err *e);
/* cuda_step_next: one thread: p = *pos_slot + 1; *pos_slot = p; *tok_slot
 *   = tok_hist[p]: the next prompt row's token and position, for a graph
 *   replayed once per prompt row (the prompt's ids uploaded to tok_hist
 *   first). tok_hist needs p + 1 entries. Enqueued. */
int  cuda_step_next(cuda_ctx *c, int32_t *tok_slot_dev, int32_t *pos_slot_dev, const int32_t *tok_hist_dev, err *e);

#ifdef __cplusplus
}
#endif

#endif
