/* roofline: this machine's limits, measured in one run, so that every speed
 * figure of a benchmark can be stated as a fraction of the limit it is bound by.
 *
 *   (a) memory read bandwidth: a STREAM-like read, the sum of a buffer much
 *       larger than the caches (default 1 GiB) with 256-bit AVX2 loads, each
 *       thread reading its own contiguous slice; one unmeasured warm-up pass,
 *       then --passes timed passes. GB/s = 1e9 bytes per second.
 *   (b) int8 dot throughput on the maddubs path: 12 independent
 *       _mm256_maddubs_epi16 -> _mm256_madd_epi16 -> _mm256_add_epi32 per
 *       loop iteration, from registers (4 byte vectors x 3 weight vectors
 *       into 4 accumulators; an empty asm keeps the compiler from hoisting
 *       them). One maddubs multiplies and adds 32 byte pairs: counted as 64
 *       ops (2 per multiply-add), the convention of
 *       ../shared/reference/MACHINE.md. The madd and add that finish the dot
 *       are not counted (they share the multiply ports with maddubs on Zen3
 *       and Intel, so one maddubs+madd pair per cycle is the ceiling: 64
 *       ops/cycle on Intel p0+p1, 32 on Zen3). An earlier form that fed each
 *       accumulator back into its next maddubs was latency-bound on Intel
 *       (5+5+1 cycles a step): about 25% below this one.
 *   (b') the same with 512-bit registers (_mm512_maddubs_epi16 ..., 128 ops a
 *       maddubs) where the CPU has AVX-512 F/BW/VL/VNNI (cpu_detect's
 *       avx512): the strata kernels use 512-bit maddubs there (the Q4_K
 *       gemm), so that is the int8 limit they are held to on such a CPU.
 *   (c) fp32 FMA throughput: 12 independent _mm256_fmadd_ps chains, 16 flops
 *       each (8 lanes x multiply + add).
 * Each is measured with 1 thread and with N threads (-t, default all online
 * CPUs); a figure is the median of the passes with the range (min..max).
 * With N threads every thread does the same work and a pass is timed from a
 * common start (a barrier) to the last thread's end.
 *
 *   roofline [-t N] [--size SIZE] [--passes P] [--quick] [-o table|json]
 *
 * --size takes K/M/G suffixes (binary). --quick: 3 passes and 20 ms compute
 * passes instead of 100 ms (for smoke tests; pair with a small --size).
 * -o json prints one JSON object (schema in the usage text) instead of the
 * table. Without AVX2/FMA it prints a message and exits 0 (the probe
 * measures the AVX2 path the kernels use; there is nothing to compare).
 * Exit codes: 0 ok (or skipped), 1 runtime error, 2 usage. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "util/cpu.h"

#define MAX_THREADS 256
#define MAX_PASSES 101
#define N_CHAINS 12

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ---- kernels ---- */

static volatile int64_t g_sink;   /* results go here so nothing is dead code */

/* Sum of n bytes (n a multiple of 256) as 32-bit lanes, 8 accumulators. */
static int64_t read_sum(const uint8_t *p, size_t n)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    __m256i a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (size_t i = 0; i < n; i += 256) {
        const __m256i *q = (const __m256i *)(p + i);
        a0 = _mm256_add_epi32(a0, _mm256_load_si256(q + 0));
        a1 = _mm256_add_epi32(a1, _mm256_load_si256(q + 1));
        a2 = _mm256_add_epi32(a2, _mm256_load_si256(q + 2));
        a3 = _mm256_add_epi32(a3, _mm256_load_si256(q + 3));
        a4 = _mm256_add_epi32(a4, _mm256_load_si256(q + 4));
        a5 = _mm256_add_epi32(a5, _mm256_load_si256(q + 5));
        a6 = _mm256_add_epi32(a6, _mm256_load_si256(q + 6));
        a7 = _mm256_add_epi32(a7, _mm256_load_si256(q + 7));
    }
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)),
                                 _mm256_add_epi32(_mm256_add_epi32(a4, a5), _mm256_add_epi32(a6, a7)));
    int32_t lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, s);
    int64_t t = 0;
    for (int i = 0; i < 8; i++) t += lanes[i];
    return t;
}

/* iters x 12 maddubs (64 ops each): 4 byte vectors x 3 weight vectors, each
 * product through madd into one of 4 accumulators. The empty asm tells the
 * compiler that the weights and accumulators change every iteration, so no
 * product can be hoisted out of the loop and they stay in registers; it
 * emits no instruction. The products are independent of one another (no
 * latency chain through maddubs), so only the ports bound the loop. */
static int64_t int8_chains(uint64_t iters, int seed)
{
    const __m256i x0 = _mm256_set1_epi8((char)(1 + seed)), x1 = _mm256_set1_epi8(2), x2 = _mm256_set1_epi8(3),
                  x3 = _mm256_set1_epi8(4), ones = _mm256_set1_epi16(1);
    __m256i b0 = _mm256_set1_epi8(7), b1 = _mm256_set1_epi8(-9), b2 = _mm256_set1_epi8(11);
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (uint64_t i = 0; i < iters; i++) {
        __asm__ volatile("" : "+x"(b0), "+x"(b1), "+x"(b2), "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3));
#define DOT(acc, x, b) acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(x, b), ones))
        DOT(a0, x0, b0); DOT(a1, x1, b0); DOT(a2, x2, b0); DOT(a3, x3, b0);
        DOT(a0, x0, b1); DOT(a1, x1, b1); DOT(a2, x2, b1); DOT(a3, x3, b1);
        DOT(a0, x0, b2); DOT(a1, x1, b2); DOT(a2, x2, b2); DOT(a3, x3, b2);
#undef DOT
    }
    const __m256i s = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    return _mm256_extract_epi64(s, 0) ^ _mm256_extract_epi64(s, 3);
}

/* int8_chains with 512-bit registers: iters x 12 maddubs of 128 ops. */
__attribute__((target("avx2,avx512f,avx512bw"))) static int64_t int8_chains_z(uint64_t iters, int seed)
{
    const __m512i x0 = _mm512_set1_epi8((char)(1 + seed)), x1 = _mm512_set1_epi8(2), x2 = _mm512_set1_epi8(3),
                  x3 = _mm512_set1_epi8(4), ones = _mm512_set1_epi16(1);
    __m512i b0 = _mm512_set1_epi8(7), b1 = _mm512_set1_epi8(-9), b2 = _mm512_set1_epi8(11);
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (uint64_t i = 0; i < iters; i++) {
        __asm__ volatile("" : "+v"(b0), "+v"(b1), "+v"(b2), "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3));
#define DOT(acc, x, b) acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(x, b), ones))
        DOT(a0, x0, b0); DOT(a1, x1, b0); DOT(a2, x2, b0); DOT(a3, x3, b0);
        DOT(a0, x0, b1); DOT(a1, x1, b1); DOT(a2, x2, b1); DOT(a3, x3, b1);
        DOT(a0, x0, b2); DOT(a1, x1, b2); DOT(a2, x2, b2); DOT(a3, x3, b2);
#undef DOT
    }
    const __m512i s = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
    return _mm_cvtsi128_si64(_mm512_castsi512_si128(s)) ^ _mm_cvtsi128_si64(_mm512_extracti32x4_epi32(s, 3));
}

/* iters x N_CHAINS FMAs (16 flops each). acc*a + c converges to c/(1-a):
 * no overflow, no denormals. */
static int64_t fma_chains(uint64_t iters, int seed)
{
    __m256 acc[N_CHAINS];
    for (int j = 0; j < N_CHAINS; j++) acc[j] = _mm256_set1_ps(1.0f + 0.01f * (float)(j + seed));
    const __m256 a = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
    for (uint64_t i = 0; i < iters; i++) {
#define STEP(j) acc[j] = _mm256_fmadd_ps(acc[j], a, c)
        STEP(0); STEP(1); STEP(2);  STEP(3);  STEP(4);  STEP(5);
        STEP(6); STEP(7); STEP(8);  STEP(9);  STEP(10); STEP(11);
#undef STEP
    }
    __m256 s = acc[0];
    for (int j = 1; j < N_CHAINS; j++) s = _mm256_add_ps(s, acc[j]);
    float f[8];
    _mm256_storeu_ps(f, s);
    return (int64_t)(f[0] * 1000.0f);
}

/* ---- threads: one pass = N workers released together by a barrier ---- */

enum kind { K_READ, K_INT8, K_INT8Z, K_FMA };

typedef struct job {
    enum kind kind;
    const uint8_t *p;        /* K_READ: this thread's slice */
    size_t n;
    uint64_t iters;          /* K_INT8, K_FMA */
    int seed;
    pthread_barrier_t *bar;
    int64_t out;
} job;

static void job_run(job *j)
{
    switch (j->kind) {
    case K_READ: j->out = read_sum(j->p, j->n); break;
    case K_INT8: j->out = int8_chains(j->iters, j->seed); break;
    case K_INT8Z: j->out = int8_chains_z(j->iters, j->seed); break;
    case K_FMA:  j->out = fma_chains(j->iters, j->seed); break;
    }
}

static void *worker(void *arg)
{
    job *j = (job *)arg;
    pthread_barrier_wait(j->bar);
    job_run(j);
    return NULL;
}

/* One timed pass with nt threads (nt - 1 workers, the caller is one).
 * Returns seconds, or a negative value if a thread could not start. */
static double pass(enum kind kind, int nt, const uint8_t *buf, size_t size, uint64_t iters)
{
    static job jobs[MAX_THREADS];
    static pthread_t tid[MAX_THREADS];
    pthread_barrier_t bar;
    if (pthread_barrier_init(&bar, NULL, (unsigned)nt)) return -1;
    const size_t slice = (size / (size_t)nt) & ~(size_t)255;
    for (int t = 0; t < nt; t++) {
        jobs[t] = (job){ .kind = kind, .p = buf + (size_t)t * slice, .n = slice, .iters = iters, .seed = t, .bar = &bar };
    }
    int started = 1;
    for (int t = 1; t < nt; t++) {
        if (pthread_create(&tid[t], NULL, worker, &jobs[t])) break;
        started++;
    }
    if (started < nt) {
        /* cannot release the barrier with fewer threads: the started ones are
         * stuck in it; give up (a run-time error the caller reports) */
        fprintf(stderr, "roofline: cannot start %d threads\n", nt);
        exit(1);
    }
    pthread_barrier_wait(&bar);
    const double t0 = now_s();
    job_run(&jobs[0]);
    for (int t = 1; t < nt; t++) pthread_join(tid[t], NULL);
    const double t1 = now_s();
    pthread_barrier_destroy(&bar);
    int64_t s = 0;
    for (int t = 0; t < nt; t++) s += jobs[t].out;
    g_sink = s;
    return t1 - t0;
}

typedef struct stat3 { double med, lo, hi; } stat3;

static stat3 summarize(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    stat3 s = { n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v[0], v[n - 1] };
    return s;
}

typedef struct result { int threads; stat3 read_gbs, int8_gops, int8z_gops, fp32_gflops; } result;

/* it_int8z: 0 = no 512-bit probe (the CPU lacks AVX-512) */
static void measure(result *r, int nt, const uint8_t *buf, size_t size, int passes, uint64_t it_int8,
                    uint64_t it_int8z, uint64_t it_fma)
{
    double v[MAX_PASSES];
    const size_t slice = (size / (size_t)nt) & ~(size_t)255;
    r->threads = nt;
    pass(K_READ, nt, buf, size, 0);   /* warm-up: TLB, page state, clocks */
    for (int i = 0; i < passes; i++) v[i] = (double)slice * nt / pass(K_READ, nt, buf, size, 0) * 1e-9;
    r->read_gbs = summarize(v, passes);
    pass(K_INT8, nt, NULL, 0, it_int8 / 8 + 1);
    for (int i = 0; i < passes; i++)
        v[i] = (double)it_int8 * 12 * 64.0 * nt / pass(K_INT8, nt, NULL, 0, it_int8) * 1e-9;
    r->int8_gops = summarize(v, passes);
    r->int8z_gops = (stat3){ 0, 0, 0 };
    if (it_int8z) {
        pass(K_INT8Z, nt, NULL, 0, it_int8z / 8 + 1);
        for (int i = 0; i < passes; i++)
            v[i] = (double)it_int8z * 12 * 128.0 * nt / pass(K_INT8Z, nt, NULL, 0, it_int8z) * 1e-9;
        r->int8z_gops = summarize(v, passes);
    }
    pass(K_FMA, nt, NULL, 0, it_fma / 8 + 1);
    for (int i = 0; i < passes; i++)
        v[i] = (double)it_fma * N_CHAINS * 16.0 * nt / pass(K_FMA, nt, NULL, 0, it_fma) * 1e-9;
    r->fp32_gflops = summarize(v, passes);
}

/* Iterations of a compute kernel that take about target_s on one thread. */
static uint64_t calibrate(enum kind kind, double target_s)
{
    uint64_t it = 1 << 14;
    for (;;) {
        double t = pass(kind, 1, NULL, 0, it);
        if (t > 0.01 || it > (1ull << 40)) {
            double want = (double)it * target_s / (t > 0 ? t : 1e-9);
            return want < 1000 ? 1000 : (uint64_t)want;
        }
        it *= 4;
    }
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v <= 0) return -1;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i') end++;
    if (*end == 'B') end++;
    if (*end || v * mul > 1e13) return -1;
    *out = (size_t)(v * mul);
    return 0;
}

static int parse_int(const char *s, long lo, long hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: roofline [-t N] [--size SIZE] [--passes P] [--quick] [-o table|json]\n"
        "\n"
        "Measure, with 1 thread and with N threads, the memory read bandwidth (sum of a\n"
        "SIZE buffer, AVX2 loads), the int8 dot throughput (maddubs->madd->add chains,\n"
        "64 ops per maddubs; with AVX-512 also the 512-bit chains, 128 ops) and the fp32\n"
        "FMA throughput (16 flops per FMA): medians of P passes with their range.\n"
        "\n"
        "  -t, --threads N   threads of the second column (default: all online CPUs)\n"
        "  --size SIZE       read buffer, K/M/G suffixes (default 1G; keep it far above the caches)\n"
        "  --passes P        timed passes per figure (default 5, at most %d)\n"
        "  --quick           3 passes, 20 ms compute passes (smoke tests)\n"
        "  -o table|json     output (default table). json: {\"cpus\", \"cpu_model\",\n"
        "                    \"buffer_bytes\", \"passes\", \"results\": [{\"threads\",\n"
        "                    \"read_gbs\", \"int8_gops\", [\"int8_avx512_gops\",] \"fp32_gflops\"},\n"
        "                    ...]}, each figure\n"
        "                    {\"median\", \"min\", \"max\"}\n", MAX_PASSES);
}

static void cpu_model(char *buf, size_t cap)
{
    snprintf(buf, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ' || *c == '\t') c++;
                c[strcspn(c, "\n")] = 0;
                snprintf(buf, cap, "%s", c);
            }
            break;
        }
    }
    fclose(f);
}

static void json_stat(const char *name, stat3 s, const char *sep)
{
    printf("\"%s\": {\"median\": %.3f, \"min\": %.3f, \"max\": %.3f}%s", name, s.med, s.lo, s.hi, sep);
}

static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20) printf("\\u%04x", *s);
        else putchar(*s);
    }
    putchar('"');
}

static void fmt_stat(char *buf, size_t cap, stat3 s)
{
    const char *f = s.med >= 100 ? "%.0f (%.0f..%.0f)" : "%.1f (%.1f..%.1f)";
    snprintf(buf, cap, f, s.med, s.lo, s.hi);
}

int main(int argc, char **argv)
{
    int nt = cpu_count(), passes = 5, quick = 0, json = 0, passes_set = 0;
    size_t size = (size_t)1 << 30;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--quick")) quick = 1;
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!v || parse_int(v, 1, MAX_THREADS, &nt)) {
                fprintf(stderr, "roofline: %s needs a thread count from 1 to %d\n", a, MAX_THREADS);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--passes")) {
            if (!v || parse_int(v, 1, MAX_PASSES, &passes)) {
                fprintf(stderr, "roofline: --passes needs a whole number from 1 to %d\n", MAX_PASSES);
                return 2;
            }
            passes_set = 1;
            i++;
        } else if (!strcmp(a, "--size")) {
            if (!v || parse_size(v, &size) || size < (1u << 20)) {
                fprintf(stderr, "roofline: --size needs a size of at least 1M (K/M/G suffixes)\n");
                return 2;
            }
            i++;
        } else if (!strcmp(a, "-o")) {
            if (v && !strcmp(v, "json")) json = 1;
            else if (v && (!strcmp(v, "table") || !strcmp(v, "md"))) json = 0;
            else { fprintf(stderr, "roofline: -o must be table or json\n"); return 2; }
            i++;
        } else {
            fprintf(stderr, "roofline: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (quick && !passes_set) passes = 3;

    const cpu_features cf = cpu_detect();
    if (!cf.avx2 || !cf.fma) {
        if (json) printf("{\"skipped\": \"no AVX2/FMA\"}\n");
        else printf("roofline: skipped: this CPU has no AVX2/FMA (the probe measures the AVX2 path)\n");
        return 0;
    }

    /* 2 MiB-aligned, transparent huge pages where the kernel allows them,
     * filled (first touch) before anything is timed. */
    size = (size + 255) & ~(size_t)255;
    const size_t align = (size_t)2 << 20;
    uint8_t *buf = aligned_alloc(align, (size + align - 1) / align * align);
    if (!buf) {
        fprintf(stderr, "roofline: cannot allocate %zu bytes for the read buffer\n", size);
        return 1;
    }
    madvise(buf, (size + align - 1) / align * align, MADV_HUGEPAGE);
    for (size_t i = 0; i < size; i += 4096) memset(buf + i, (int)(i >> 12) & 0x7f, size - i < 4096 ? size - i : 4096);

    const double target = quick ? 0.02 : 0.1;
    const uint64_t it_int8 = calibrate(K_INT8, target), it_fma = calibrate(K_FMA, target);
    const uint64_t it_int8z = cf.avx512 ? calibrate(K_INT8Z, target) : 0;

    result res[2];
    int nres = 0;
    measure(&res[nres++], 1, buf, size, passes, it_int8, it_int8z, it_fma);
    if (nt > 1) measure(&res[nres++], nt, buf, size, passes, it_int8, it_int8z, it_fma);
    free(buf);

    char model[256];
    cpu_model(model, sizeof model);
    if (json) {
        printf("{\"cpus\": %d, \"cpu_model\": ", cpu_count());
        json_str(model);
        printf(", \"buffer_bytes\": %zu, \"passes\": %d, \"results\": [", size, passes);
        for (int r = 0; r < nres; r++) {
            printf("%s{\"threads\": %d, ", r ? ", " : "", res[r].threads);
            json_stat("read_gbs", res[r].read_gbs, ", ");
            json_stat("int8_gops", res[r].int8_gops, ", ");
            if (it_int8z) json_stat("int8_avx512_gops", res[r].int8z_gops, ", ");
            json_stat("fp32_gflops", res[r].fp32_gflops, "}");
        }
        printf("]}\n");
        return 0;
    }
    printf("roofline: %s, %d online CPUs; read buffer %.2f GiB; median (min..max) of %d passes\n\n", model,
           cpu_count(), (double)size / (1 << 30), passes);
    printf("| metric | 1 thread |");
    if (nres > 1) printf(" %d threads |", nt);
    printf(" unit |\n|---|---:|");
    if (nres > 1) printf("---:|");
    printf("---|\n");
    static const char *names[4] = { "memory read (sum, AVX2 loads)", "int8 dot (maddubs->madd->add)",
                                    "int8 dot, 512-bit (maddubs->madd->add)", "fp32 FMA" };
    static const char *units[4] = { "GB/s", "GOPS", "GOPS", "GFLOP/s" };
    for (int m = 0; m < 4; m++) {
        if (m == 2 && !it_int8z) continue;
        printf("| %s |", names[m]);
        for (int r = 0; r < nres; r++) {
            char b[96];
            const stat3 *ms[4] = { &res[r].read_gbs, &res[r].int8_gops, &res[r].int8z_gops, &res[r].fp32_gflops };
            stat3 s = *ms[m];
            fmt_stat(b, sizeof b, s);
            printf(" %s |", b);
        }
        printf(" %s |\n", units[m]);
    }
    return 0;
}
