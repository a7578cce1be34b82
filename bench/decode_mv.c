/* decode_mv: one thread's decode matvec rate for one weight type, compute
 * against memory, in one run (issue 5).
 *
 *   decode_mv [TYPE] [MB]     (default q4_K, 512 MB of weight rows)
 *
 * Rows are 2048 wide (an expert's gate/up input). Prints GB/s of weight
 * bytes for:
 *   l2        ops.dot over 64 rows re-read from cache (the compute limit)
 *   dram      ops.dot streaming MB of rows once (no software prefetch)
 *   dram+pfN  the same with each row prefetching row r+N (N = 4: the
 *             engine's QUANT_PF_ROWS via quant_gemm; 8, 16)
 *   read      one 8-byte load per 64-byte line over the same bytes (the
 *             memory limit of one thread)
 * three rounds, wall time. A decode loop can at best reach min(l2, read);
 * where l2 is close to read the two do not overlap and the loop lands
 * near their harmonic mean. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quant/qtype.h"
#include "quant/quant.h"
#include "util/cpu.h"
#include "util/err.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const char *tname = argc > 1 ? argv[1] : "q4_K";
    const long mb = argc > 2 ? atol(argv[2]) : 512;
    const int type = qtype_from_name(tname);
    const int64_t K = 2048;
    err e;
    err_clear(&e);
    quant_ops ops, aops;
    uint64_t rs, as;
    if (type < 0 || mb < 1 || quant_ops_get(type, cpu_best_isa(), &ops, &e) ||
        quant_ops_get(ops.dot_type, cpu_best_isa(), &aops, &e) || qtype_row_bytes(type, K, &rs, &e) ||
        qtype_row_bytes(ops.dot_type, K, &as, &e)) {
        fprintf(stderr, "decode_mv: bad type '%s' or size (%s)\n", tname, e.msg);
        return 2;
    }
    const int nw = (int)(((uint64_t)mb << 20) / rs);
    unsigned char *w = malloc((size_t)nw * rs), *a = malloc(as);
    float *x = malloc(sizeof(float) * K), *y = malloc(sizeof(float) * (size_t)nw);
    if (!w || !a || !x || !y) { fprintf(stderr, "decode_mv: out of memory\n"); return 1; }
    for (int64_t i = 0; i < K; i++) x[i] = (float)((i * 7) % 17 - 8) * 0.1f;
    for (int r = 0; r < nw; r++) ops.quant(x, w + (size_t)r * rs, K);
    aops.act_quant(x, a, K);
    const double bytes = (double)nw * (double)rs;
    printf("decode_mv: %s, %d rows x %lld, %.0f MB, 1 thread, isa %s\n", qtype_name(type), nw, (long long)K,
           bytes / 1e6, cpu_isa_name(cpu_best_isa()));
    for (int round = 1; round <= 3; round++) {
        double t0 = now_s();
        const int it = (int)(bytes / (64.0 * (double)rs));
        for (int i = 0; i < it; i++)
            for (int r = 0; r < 64; r++) y[r] = ops.dot(K, w + (size_t)r * rs, a);
        const double l2 = (double)it * 64.0 * (double)rs / (now_s() - t0) / 1e9;
        t0 = now_s();
        for (int r = 0; r < nw; r++) y[r] = ops.dot(K, w + (size_t)r * rs, a);
        const double dram = bytes / (now_s() - t0) / 1e9;
        t0 = now_s();
        quant_gemm(&ops, K, w, rs, nw, a, 0, 1, y, 1);
        const double pf4 = bytes / (now_s() - t0) / 1e9;
        double pf[2];
        for (int k = 0; k < 2; k++) {
            const int d = k ? 16 : 8;
            t0 = now_s();
            for (int r = 0; r < nw; r++) {
                if (r + d < nw)
                    for (size_t o = 0; o < rs; o += 64) __builtin_prefetch(w + (size_t)(r + d) * rs + o, 0, 1);
                y[r] = ops.dot(K, w + (size_t)r * rs, a);
            }
            pf[k] = bytes / (now_s() - t0) / 1e9;
        }
        t0 = now_s();
        uint64_t acc = 0;
        for (size_t i = 0; i + 8 <= (size_t)bytes; i += 64) { uint64_t v; memcpy(&v, w + i, 8); acc += v; }
        const double rd = bytes / (now_s() - t0) / 1e9;
        printf("round %d: l2 %.2f  dram %.2f  dram+pf4 %.2f  dram+pf8 %.2f  dram+pf16 %.2f  read %.2f GB/s%s\n",
               round, l2, dram, pf4, pf[0], pf[1], rd, acc == 42 ? " " : "");
    }
    free(w); free(a); free(x); free(y);
    return 0;
}
