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

/* ==== Timing (benchmarks) ====
 * timer_begin records an event on the stream; timer_end records a second,
 * waits for it and returns the milliseconds between them. */
int  cuda_timer_begin(cuda_ctx *c, err *e);
int  cuda_timer_end(cuda_ctx *c, float *ms, err *e);
/* A read-only bandwidth probe: every byte of buf[0..bytes) is read once with
 * 16-byte loads and folded into *sink_dev (one uint32, device) so the loads
 * cannot be dropped. bytes must be a multiple of 16, buf 16-byte aligned. */
int  cuda_read_probe(cuda_ctx *c, const void *buf_dev, size_t bytes, uint32_t *sink_dev, err *e);

/* ==== Activation quantization ====
 * The matvec for weight type wtype reads its input already quantized to the
 * weight's dot type (Q8_K for Q4_K/Q6_K, Q8_0 for Q8_0), as the CPU does.
 * cuda_act_bytes: bytes of one quantized row of n elements for weights of
 * type wtype; 0 if wtype is unsupported or n is not a whole number of blocks.
 *
 * cuda_act_quant quantizes `rows` rows of n floats (x, row-major) into xq
 * (rows * cuda_act_bytes(wtype, n) bytes, rows back to back), BIT-IDENTICAL
 * to the CPU's act_quant of the dot type (quant_ref_quant_q8_K: first
 * largest |x| sets the sign of the scale, nearest-even, q <= 127; and
 * quant_ref_act_quant_q8_0: q = round-half-even(x * (127/amax)), d =
 * half(amax/127)). Input must be finite. Enqueued. */
size_t cuda_act_bytes(int wtype, int64_t n);
int  cuda_act_quant(cuda_ctx *c, int wtype, const float *x_dev, void *xq_dev, int64_t n, int rows, err *e);

/* ==== Quantized matvec ====
 * For b in [0, n_batch): matrix m = ids ? ids[b] : b, whose `rows` rows of k
 * weights lie back to back at w + m * w_stride (ggml row layout, rows of
 * k/blck blocks); input row xb at xq + b * x_stride (already quantized by
 * cuda_act_quant for this wtype; x_stride 0 = every b shares one row);
 * output y[b * y_stride + r] = dot(row r of matrix m, xb) for r < rows.
 *
 * Per block the arithmetic is the CPU dot's (quant_ref_dot_*): integer
 * products and sums per (sub-)block, then float scaling with the same
 * factors (d_w * d_x, and dmin_w * d_x for the Q4_K mins). Blocks are
 * split across a warp and summed in a different order than the CPU's, so
 * results agree up to float rounding (tests: NMSE < 1e-10).
 *
 * Alignment: w 16-byte aligned for Q4_K; 2-byte for Q6_K / Q8_0 (any row
 * size: the kernel stages whole tiles with 16-byte copies and copies the
 * unaligned ends byte-wise). xq: 4-byte aligned for Q8_K, 2 for Q8_0.
 * ids: device int32, each in [0, number of matrices): not checked.
 * Limits: k a multiple of 256 (K-quants) or 32 (Q8_0); one tile of 4 rows
 * plus the activations must fit in the device's shared memory
 * (k up to about 40000 for Q8_0). Enqueued. */
typedef struct cuda_matvec_args {
    int            wtype;     /* QTYPE_Q4_K, QTYPE_Q6_K or QTYPE_Q8_0 (quant/qtype.h ids) */
    const void    *w;         /* device */
    size_t         w_stride;  /* bytes from matrix m to m + 1 */
    const int32_t *ids;       /* device, n_batch entries, or NULL */
    int64_t        rows, k;
    int            n_batch;   /* >= 1, <= 65535 */
    const void    *xq;        /* device */
    size_t         x_stride;  /* bytes; 0 = shared input */
    float         *y;         /* device */
    size_t         y_stride;  /* floats */
} cuda_matvec_args;

int  cuda_matvec_batch(cuda_ctx *c, const cuda_matvec_args *a, err *e);
/* One matrix: y[r] = dot(row r of w, xq) for r < rows. */
int  cuda_matvec(cuda_ctx *c, int wtype, const void *w_dev, int64_t rows, int64_t k, const void *xq_dev,
                 float *y_dev, err *e);

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

#ifdef __cplusplus
}
#endif

#endif
