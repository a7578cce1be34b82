/* gemm: single-thread throughput of the matmul kernels (quant.h
 * quant_gemm) for every type with quant_ops, against the plain dot loop,
 * as fractions of this machine's measured peak.
 *
 *   gemm [--quick] [--best] [-o md|csv] [--type NAME]
 *
 * For each type (F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K
 * Q6_K, AVX2 quant_ops), each shape (K=2048 x 768 weight rows, K=768, 512
 * and 256 x 2048 weight rows: a MoE expert's gate/up matrix and down
 * matrices of three model sizes, see k_shapes) and each number of
 * activation rows na in 1 4 8 16 64, it times
 *   (a) dot loop: quant_gemm with .gemm = NULL (nw x na calls of ops.dot),
 *   (b) gemm:     quant_gemm with the type's blocked kernel ("-" if none),
 * each as the median of several repetitions (one repetition: enough calls to
 * last >= 12 ms, 4 ms with --quick; --best: the fastest repetition instead,
 * for machines shared with other work), and prints GOPS = 2 * K * nw * na / time,
 * the speedup (b)/(a), and (b) as a fraction of the peak measured in the same
 * run by two in-file probes:
 *   int8 peak: independent _mm256_maddubs_epi16 -> _mm256_madd_epi16 ->
 *     _mm256_add_epi32 chains, 64 ops per maddubs (32 byte pairs, 2 ops per
 *     multiply-add); the reference for the integer formats;
 *   fp32 peak: independent _mm256_fmadd_ps chains, 16 ops per FMA; the
 *     reference for F32/F16/BF16.
 * On a CPU with AVX-VNNI or AVX-512 VNNI it also times, for the types
 * whose quant_ops of the best ISA (cpu_best_isa: AVX-VNNI, or AVX-512 with
 * its 512-bit and EVEX-encoded VNNI kernels) has its own gemm kernel,
 *   (c) vnni:     that kernel, A/B against (b) in one run (the repetitions
 *                 of (b) and (c) alternate, so drift hits both alike),
 * printed as GOPS, (c)/(b) and (c) as a fraction of the same int8 peak
 * (the maddubs one: all the kernels still multiply bytes with maddubs), and
 * probes a third peak for reference,
 *   vnni int8 peak: independent maddubs -> vpdpwssd chains (what the VNNI
 *     kernels' inner step is), 64 ops per maddubs.
 * (c) is checked bit for bit against (a) as well.
 * Weights are quantized with ops.quant from random floats, activations with
 * the dot type's act_quant. The bench also checks that (b) equals (a) bit
 * for bit and says MISMATCH when it does not. About 30-60 s by default.
 * Single thread. Times are the thread's CPU time (CLOCK_THREAD_CPUTIME_ID),
 * so other processes on a shared machine cost less accuracy than they would
 * in wall time (they still share caches and memory bandwidth). */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quant/quant.h"
#include "quant/qtype.h"
#include "util/cpu.h"
#include "util/err.h"

/* Thread CPU time, not wall time: the machine is shared, and time spent
 * descheduled would otherwise count against the kernel being measured. */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng_next(uint64_t *s)   /* splitmix64 */
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Roughly Gaussian (sum of 4 uniforms), scale varying every 32 values. */
static void gen_floats(uint64_t *s, float *x, int64_t n)
{
    float scale = 1.0f;
    for (int64_t i = 0; i < n; i++) {
        if (i % 32 == 0) scale = 0.25f + (float)(rng_next(s) >> 40) * (1.0f / 16777216.0f) * 2.0f;
        double u = 0;
        for (int k = 0; k < 4; k++) u += (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
        x[i] = (float)((u - 2.0) * 1.7) * scale;
    }
}

/* ==== Peak probes ====
 * The asm barriers make the compiler treat the operands as changing every
 * iteration (so nothing is hoisted) without emitting any instruction. */

/* The timed loops are inline asm, so that what runs is exactly the chain
 * being measured (compilers spill or hoist such loops in C).
 * int8: 6 independent chains per iteration, each
 *   t = maddubs(x, y); t = madd(t, ones); acc += t
 * (x, y, ones loop-invariant registers; the asm is opaque, nothing is
 * hoisted), 6 x 64 ops per iteration.
 * fp32: 12 independent FMA accumulator chains (enough for FMA latency x
 * throughput on current cores), 12 x 16 ops per iteration. */
#define PROBE_CHAINS 6
/* The int8 probes' common parts: x = 1, y = 2 (bytes), ones (int16), six
 * zeroed accumulators ymm9..14, the loop label; and their operands. */
#define I8_SETUP \
    "vpcmpeqb %%ymm0, %%ymm0, %%ymm0\n\t" "vpabsb %%ymm0, %%ymm0\n\t" "vpaddb %%ymm0, %%ymm0, %%ymm1\n\t" \
    "vpcmpeqw %%ymm2, %%ymm2, %%ymm2\n\t" "vpabsw %%ymm2, %%ymm2\n\t" \
    "vpxor %%ymm9, %%ymm9, %%ymm9\n\t" "vpxor %%ymm10, %%ymm10, %%ymm10\n\t" "vpxor %%ymm11, %%ymm11, %%ymm11\n\t" \
    "vpxor %%ymm12, %%ymm12, %%ymm12\n\t" "vpxor %%ymm13, %%ymm13, %%ymm13\n\t" \
    "vpxor %%ymm14, %%ymm14, %%ymm14\n\t" "1:\n\t"
/* the loop's end and the operand list every int8 chain shares */
#define I8_END \
    "dec %0\n\t" "jnz 1b\n\t" "vzeroupper\n\t" \
    : "+r"(iters) : : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", \
      "xmm11", "xmm12", "xmm13", "xmm14", "cc"
#define FMA_CHAINS 12
#define I8(t, acc) "vpmaddubsw %%ymm1, %%ymm0, %%ymm" #t "\n\t" "vpmaddwd %%ymm2, %%ymm" #t ", %%ymm" #t "\n\t" \
                   "vpaddd %%ymm" #t ", %%ymm" #acc ", %%ymm" #acc "\n\t"
__attribute__((noinline)) static void int8_chains(long iters)
{
    __asm__ volatile(
        I8_SETUP
        I8(3, 9) I8(4, 10) I8(5, 11) I8(6, 12) I8(7, 13) I8(8, 14)
        I8_END);
}
#undef I8

#define FM(acc) "vfmadd231ps %%ymm12, %%ymm13, %%ymm" #acc "\n\t"
__attribute__((noinline)) static void fp32_chains(long iters)
{
    __asm__ volatile(
        "vxorps %%ymm12, %%ymm12, %%ymm12\n\t"
        "vxorps %%ymm13, %%ymm13, %%ymm13\n\t"
        "vxorps %%ymm0, %%ymm0, %%ymm0\n\t"
        "vxorps %%ymm1, %%ymm1, %%ymm1\n\t"
        "vxorps %%ymm2, %%ymm2, %%ymm2\n\t"
        "vxorps %%ymm3, %%ymm3, %%ymm3\n\t"
        "vxorps %%ymm4, %%ymm4, %%ymm4\n\t"
        "vxorps %%ymm5, %%ymm5, %%ymm5\n\t"
        "vxorps %%ymm6, %%ymm6, %%ymm6\n\t"
        "vxorps %%ymm7, %%ymm7, %%ymm7\n\t"
        "vxorps %%ymm8, %%ymm8, %%ymm8\n\t"
        "vxorps %%ymm9, %%ymm9, %%ymm9\n\t"
        "vxorps %%ymm10, %%ymm10, %%ymm10\n\t"
        "vxorps %%ymm11, %%ymm11, %%ymm11\n\t"
        "1:\n\t"
        FM(0) FM(1) FM(2) FM(3) FM(4) FM(5) FM(6) FM(7) FM(8) FM(9) FM(10) FM(11)
        "dec %0\n\t"
        "jnz 1b\n\t"
        "vzeroupper\n\t"
        : "+r"(iters)
        :
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
          "xmm12", "xmm13", "cc");
}
#undef FM

/* int8 with 256-bit VNNI: 6 independent chains, each t = maddubs(x, y);
 * acc = vpdpwssd(acc, t, ones): the maddubs -> madd -> add chain with madd
 * and add fused. int8_vnni_chains: the AVX-VNNI encoding (only called when
 * cpu_detect() reports avxvnni; the assembler needs the {vex} prefix to
 * pick it, %{ %} being how inline asm spells braces); int8_evex_chains: the
 * AVX512-VNNI encoding of the same instruction (only with avx512). */
#define VN(t, acc) "vpmaddubsw %%ymm1, %%ymm0, %%ymm" #t "\n\t" \
                   "%{vex%} vpdpwssd %%ymm2, %%ymm" #t ", %%ymm" #acc "\n\t"
#define VE(t, acc) "vpmaddubsw %%ymm1, %%ymm0, %%ymm" #t "\n\t" \
                   "vpdpwssd %%ymm2, %%ymm" #t ", %%ymm" #acc "\n\t"
__attribute__((noinline)) static void int8_vnni_chains(long iters)
{
    __asm__ volatile(
        I8_SETUP
        VN(3, 9) VN(4, 10) VN(5, 11) VN(6, 12) VN(7, 13) VN(8, 14)
        I8_END);
}
__attribute__((noinline)) static void int8_evex_chains(long iters)
{
    __asm__ volatile(
        I8_SETUP
        VE(3, 9) VE(4, 10) VE(5, 11) VE(6, 12) VE(7, 13) VE(8, 14)
        I8_END);
}
#undef VN
#undef VE

/* The best of repeated runs of 2^20 iterations (a few ms each: long enough
 * that clock granularity does not matter) over about min_s seconds: the
 * peak is what the core does undisturbed, so the best, not the median (a
 * conservative reference: interference lowers the kernels' medians, never
 * this). */
enum { PROBE_INT8, PROBE_FP32, PROBE_INT8_VNNI, PROBE_INT8_EVEX };
static double probe_gops(int kind, double min_s)
{
    const long iters = 1L << 20;
    const double ops_per_iter = kind == PROBE_FP32 ? FMA_CHAINS * 16.0 : PROBE_CHAINS * 64.0;
    double g[64];
    int k = 0;
    const double t_end = now_s() + min_s;
    do {
        const double t0 = now_s();
        if (kind == PROBE_FP32) fp32_chains(iters);
        else if (kind == PROBE_INT8_VNNI) int8_vnni_chains(iters);
        else if (kind == PROBE_INT8_EVEX) int8_evex_chains(iters);
        else int8_chains(iters);
        g[k++] = (double)iters * ops_per_iter / (now_s() - t0) * 1e-9;
    } while (k < 64 && (k < 5 || now_s() < t_end));
    qsort(g, (size_t)k, sizeof g[0], cmp_d);
    return g[k - 1];
}

/* ==== Kernel timing ==== */

typedef struct shape { int64_t k; int nw; } shape;
/* K x weight rows: a MoE expert's gate/up matrix (K = 2048 hidden, 768
 * expert rows) and down matrices, whose K is the expert hidden size: 768
 * (Qwen3-30B-A3B), 512 (Qwen3-Next-80B), 256 (the shortest K-quant row:
 * one super-block), against 2048 output rows. */
static const shape k_shapes[] = { { 2048, 768 }, { 768, 2048 }, { 512, 2048 }, { 256, 2048 } };
static const int k_nas[] = { 1, 4, 8, 16, 64 };
static const int k_types[] = { QTYPE_F32, QTYPE_F16, QTYPE_BF16, QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q5_0, QTYPE_Q5_1,
                               QTYPE_Q8_0, QTYPE_Q2_K, QTYPE_Q3_K, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K };
#define N_SHAPES ((int)(sizeof k_shapes / sizeof k_shapes[0]))
#define N_NAS ((int)(sizeof k_nas / sizeof k_nas[0]))
#define N_TYPES ((int)(sizeof k_types / sizeof k_types[0]))
#define MAX_NA 64

typedef struct run_cfg { int reps, best; double min_rep_s; } run_cfg;

/* Median (cfg->best: least) seconds per call of quant_gemm(ops, ...). */
/* Calls of quant_gemm(ops, ...) that last about cfg->min_rep_s. */
static long calibrate(const run_cfg *cfg, const quant_ops *ops, int64_t k, const void *w, size_t wstride, int nw,
                      const void *a, size_t astride, int na, float *y)
{
    long calls = 1;
    for (;;) {
        const double t0 = now_s();
        for (long i = 0; i < calls; i++) quant_gemm(ops, k, w, wstride, nw, a, astride, na, y, (size_t)nw);
        const double t = now_s() - t0;
        if (t >= cfg->min_rep_s * 0.5 || calls > (1L << 24)) {
            if (t < cfg->min_rep_s) calls = (long)ceil((double)calls * cfg->min_rep_s / (t > 1e-9 ? t : 1e-9));
            break;
        }
        calls *= 4;
    }
    return calls;
}

static double time_gemm(const run_cfg *cfg, const quant_ops *ops, int64_t k, const void *w, size_t wstride, int nw,
                        const void *a, size_t astride, int na, float *y)
{
    const long calls = calibrate(cfg, ops, k, w, wstride, nw, a, astride, na, y);
    double ts[16];
    const int reps = cfg->reps < 16 ? cfg->reps : 16;
    for (int r = 0; r < reps; r++) {
        const double t0 = now_s();
        for (long i = 0; i < calls; i++) quant_gemm(ops, k, w, wstride, nw, a, astride, na, y, (size_t)nw);
        ts[r] = (now_s() - t0) / (double)calls;
    }
    qsort(ts, (size_t)reps, sizeof ts[0], cmp_d);
    return cfg->best ? ts[0] : ts[reps / 2];
}

/* A/B: like time_gemm for two ops tables on the same inputs, repetitions
 * alternating (A B A B ...); median (or least) seconds per call of each in
 * t[0], t[1]. ya, yb: their outputs. */
static void time_gemm_ab(const run_cfg *cfg, const quant_ops *oa, const quant_ops *ob, int64_t k, const void *w,
                         size_t wstride, int nw, const void *a, size_t astride, int na, float *ya, float *yb,
                         double t[2])
{
    const quant_ops *o[2] = { oa, ob };
    float *ys[2] = { ya, yb };
    long calls[2];
    for (int v = 0; v < 2; v++) calls[v] = calibrate(cfg, o[v], k, w, wstride, nw, a, astride, na, ys[v]);
    double ts[2][16];
    const int reps = cfg->reps < 16 ? cfg->reps : 16;
    for (int r = 0; r < reps; r++)
        for (int v = 0; v < 2; v++) {
            const double t0 = now_s();
            for (long i = 0; i < calls[v]; i++)
                quant_gemm(o[v], k, w, wstride, nw, a, astride, na, ys[v], (size_t)nw);
            ts[v][r] = (now_s() - t0) / (double)calls[v];
        }
    for (int v = 0; v < 2; v++) {
        qsort(ts[v], (size_t)reps, sizeof ts[v][0], cmp_d);
        t[v] = cfg->best ? ts[v][0] : ts[v][reps / 2];
    }
}

static int usage(void)
{
    fprintf(stderr, "usage: gemm [--quick] [--best] [-o md|csv] [--type NAME]\n");
    return 2;
}

int main(int argc, char **argv)
{
    int quick = 0, best = 0, csv = 0, only = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--best")) best = 1;
        else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
            const char *f = argv[++i];
            if (!strcmp(f, "csv")) csv = 1;
            else if (strcmp(f, "md")) return usage();
        } else if (!strcmp(argv[i], "--type") && i + 1 < argc) {
            only = qtype_from_name(argv[++i]);
            if (only < 0) { fprintf(stderr, "gemm: unknown type %s\n", argv[i]); return 2; }
        } else return usage();
    }
    const cpu_features f = cpu_detect();
    if (!(f.avx2 && f.fma && f.f16c)) {
        fprintf(stderr, "gemm: this CPU lacks AVX2+FMA+F16C; nothing to measure\n");
        return 1;
    }
    const run_cfg cfg = { quick ? 3 : 5, best, quick ? 0.004 : 0.012 };

    const double int8_peak = probe_gops(PROBE_INT8, quick ? 0.1 : 0.3);
    const double fp32_peak = probe_gops(PROBE_FP32, quick ? 0.1 : 0.3);
    /* a 256-bit VNNI form: AVX-VNNI, or the EVEX one of AVX-512 VNNI */
    const int have_vnni = f.avxvnni || f.avx512;
    const double vnni_peak =
        have_vnni ? probe_gops(f.avxvnni ? PROBE_INT8_VNNI : PROBE_INT8_EVEX, quick ? 0.1 : 0.3) : 0.0;
    /* the "vnni" columns: the kernel of the best ISA this CPU runs (the
     * engine's: AVX-VNNI, or AVX-512 where quant.c has one for the type) */
    const cpu_isa best_isa = cpu_best_isa();

    int64_t max_elems = 0;
    for (int s = 0; s < N_SHAPES; s++)
        if (k_shapes[s].k * k_shapes[s].nw > max_elems) max_elems = k_shapes[s].k * k_shapes[s].nw;
    int64_t max_k = 0;
    for (int s = 0; s < N_SHAPES; s++)
        if (k_shapes[s].k > max_k) max_k = k_shapes[s].k;
    int max_nw = 0;
    for (int s = 0; s < N_SHAPES; s++)
        if (k_shapes[s].nw > max_nw) max_nw = k_shapes[s].nw;

    float *wf = malloc(sizeof(float) * (size_t)max_elems);
    float *af = malloc(sizeof(float) * (size_t)(max_k * MAX_NA));
    /* the widest row any type needs: F32, 4 bytes per element */
    void *w = malloc(sizeof(float) * (size_t)max_elems);
    void *a = malloc(sizeof(float) * (size_t)(max_k * MAX_NA));
    float *y1 = malloc(sizeof(float) * (size_t)max_nw * MAX_NA), *y2 = malloc(sizeof(float) * (size_t)max_nw * MAX_NA);
    float *y3 = malloc(sizeof(float) * (size_t)max_nw * MAX_NA);
    if (!wf || !af || !w || !a || !y1 || !y2 || !y3) { fprintf(stderr, "gemm: out of memory\n"); return 1; }
    uint64_t seed = 12345;
    gen_floats(&seed, wf, max_elems);
    gen_floats(&seed, af, max_k * MAX_NA);

    if (csv)
        printf("type,k,nw,na,dot_gops,gemm_gops,speedup,peak,peak_gops,dot_frac,gemm_frac,match,"
               "vnni_gops,vnni_speedup,vnni_frac,vnni_peak_gops,vnni_match\n");
    else {
        printf("# gemm: single thread, %s, %s of %d repetitions\n", quick ? "--quick" : "default run",
               best ? "best" : "median", cfg.reps);
        printf("# int8 peak (maddubs->madd->add chains): %.1f GOPS; fp32 peak (FMA chains): %.1f GOPS\n",
               int8_peak, fp32_peak);
        if (have_vnni)
            printf("# VNNI: int8 peak of maddubs->vpdpwssd chains %.1f GOPS (for reference; every /peak\n"
                   "# column, vnni's included, is of the 256-bit maddubs->madd->add peak above)\n"
                   "# vnni columns: the %s kernels (the engine's; STRATA_ISA=avxvnni for the 256-bit ones)\n",
                   vnni_peak, cpu_isa_name(best_isa));
        else printf("# no AVX-VNNI or AVX-512 VNNI on this CPU: vnni columns empty\n");
        printf("\n| type | K x rows | na | dot-loop GOPS | gemm GOPS | speedup | dot/peak | gemm/peak "
               "| vnni GOPS | vnni/gemm | vnni/peak |\n");
        printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    }
    fflush(stdout);
    int mismatches = 0;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const int t = k_types[ti];
        if (only >= 0 && t != only) continue;
        quant_ops ops, aops;
        err e;
        err_clear(&e);
        if (quant_ops_get(t, CPU_ISA_AVX2, &ops, &e) || quant_ops_get(ops.dot_type, CPU_ISA_AVX2, &aops, &e)) {
            fprintf(stderr, "gemm: %s: %s\n", qtype_name(t), e.msg);
            continue;
        }
        quant_ops loop = ops;
        loop.gemm = NULL;
        /* the best ISA's ops, when they have a gemm kernel of their own */
        quant_ops vops;
        int have_v = 0;
        if (best_isa >= CPU_ISA_AVXVNNI && ops.gemm && !quant_ops_get(t, best_isa, &vops, &e) && vops.gemm &&
            vops.gemm != ops.gemm)
            have_v = 1;
        const int is_float = t == QTYPE_F32 || t == QTYPE_F16 || t == QTYPE_BF16;
        const double peak = is_float ? fp32_peak : int8_peak;
        for (int si = 0; si < N_SHAPES; si++) {
            const int64_t k = k_shapes[si].k;
            const int nw = k_shapes[si].nw;
            uint64_t wrow = 0, arow = 0;
            if (qtype_row_bytes(t, k, &wrow, &e) || qtype_row_bytes(ops.dot_type, k, &arow, &e)) {
                fprintf(stderr, "gemm: %s: %s\n", qtype_name(t), e.msg);
                continue;
            }
            for (int r = 0; r < nw; r++) ops.quant(wf + (int64_t)r * k, (uint8_t *)w + (size_t)r * wrow, k);
            for (int c = 0; c < MAX_NA; c++) aops.act_quant(af + (int64_t)c * k, (uint8_t *)a + (size_t)c * arow, k);
            for (int ni = 0; ni < N_NAS; ni++) {
                const int na = k_nas[ni];
                const double flops = 2.0 * (double)k * nw * na;
                const double t_dot = time_gemm(&cfg, &loop, k, w, wrow, nw, a, arow, na, y1);
                const double g_dot = flops / t_dot * 1e-9;
                double g_gemm = 0, g_vnni = 0;
                int match = 1, vmatch = 1;
                const size_t ybytes = sizeof(float) * (size_t)nw * (size_t)na;
                if (have_v) {
                    double tt[2];
                    time_gemm_ab(&cfg, &ops, &vops, k, w, wrow, nw, a, arow, na, y2, y3, tt);
                    g_gemm = flops / tt[0] * 1e-9;
                    g_vnni = flops / tt[1] * 1e-9;
                    match = !memcmp(y1, y2, ybytes);
                    vmatch = !memcmp(y1, y3, ybytes);
                    mismatches += !match + !vmatch;
                } else if (ops.gemm) {
                    const double t_gemm = time_gemm(&cfg, &ops, k, w, wrow, nw, a, arow, na, y2);
                    g_gemm = flops / t_gemm * 1e-9;
                    match = !memcmp(y1, y2, ybytes);
                    if (!match) mismatches++;
                }
                if (csv) {
                    printf("%s,%lld,%d,%d,%.2f,%.2f,%.3f,%s,%.1f,%.3f,%.3f,%s,%.2f,%.3f,%.3f,%.1f,%s\n", qtype_name(t),
                           (long long)k, nw, na, g_dot, g_gemm, ops.gemm ? g_gemm / g_dot : 0.0,
                           is_float ? "fp32" : "int8", peak, g_dot / peak, g_gemm / peak,
                           ops.gemm ? (match ? "yes" : "MISMATCH") : "-", g_vnni, have_v ? g_vnni / g_gemm : 0.0,
                           g_vnni / peak, vnni_peak, have_v ? (vmatch ? "yes" : "MISMATCH") : "-");
                } else if (ops.gemm) {
                    printf("| %s | %lld x %d | %d | %.1f | %.1f | %.2fx | %.0f%% | %.0f%%%s |", qtype_name(t),
                           (long long)k, nw, na, g_dot, g_gemm, g_gemm / g_dot, 100 * g_dot / peak,
                           100 * g_gemm / peak, match ? "" : " MISMATCH");
                    if (have_v)
                        printf(" %.1f | %.2fx | %.0f%%%s |\n", g_vnni, g_vnni / g_gemm, 100 * g_vnni / peak,
                               vmatch ? "" : " MISMATCH");
                    else printf(" - | - | - |\n");
                } else {
                    printf("| %s | %lld x %d | %d | %.1f | - | - | %.0f%% | - | - | - | - |\n", qtype_name(t),
                           (long long)k, nw, na, g_dot, 100 * g_dot / peak);
                }
                fflush(stdout);
            }
        }
    }
    if (!csv) {
        printf("\npeaks: int8 %.1f GOPS (integer types), fp32 %.1f GOPS (F32/F16/BF16)", int8_peak, fp32_peak);
        if (have_vnni) printf("; int8 maddubs->vpdpwssd %.1f GOPS (reference only)", vnni_peak);
        printf("\n");
    }
    free(wf); free(af); free(w); free(a); free(y1); free(y2); free(y3);
    if (mismatches) {
        fprintf(stderr, "gemm: %d gemm results differ from the dot loop\n", mismatches);
        return 1;
    }
    return 0;
}
