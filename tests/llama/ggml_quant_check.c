/* ggml_quant_check: strata's activation quantizers against the real ggml-cpu
 * of the pinned llama.cpp build (tests/llama/README.md), bit for bit.
 *
 *   ggml_quant_check LIBDIR [VARIANT]     (VARIANT default: haswell)
 *
 * For Q8_0, Q8_1 and Q8_K: ggml-cpu's exported quantize_row_<t> (what
 * llama.cpp runs on activations) against strata's act_quant, scalar and
 * AVX2; and libggml-base's quantize_row_<t>_ref (what llama-quantize writes)
 * against strata's quant. Data: Gaussian rows at random scales, rows of
 * exact halves (x * 127 / amax lands on k + 0.5) and rows crafted so that
 * 127 / amax and 1 / (amax / 127) differ, and blocks so tiny that 127 / amax
 * overflows. Prints one line per check and
 * "ggml_quant: N passed, N failed". Exit 3 if the libraries do not load. */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"

typedef void (*q_fn)(const float *, void *, int64_t);

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double unif(void)
{
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}
static double gauss(void)
{
    double u = unif(), v = unif();
    if (u < 1e-300) u = 1e-300;
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* Row kinds: 0 Gaussian at a random scale, 1 halves: values (k + 0.5) * amax
 * / 127 with one element = amax, 2 small integers times a power-of-two step
 * (exact products), 3 Gaussian with outliers, 4 tiny blocks (amax down to
 * 1e-39, where 127 / amax overflows) and all-zero blocks. */
static void fill(float *x, int64_t n, int kind)
{
    const double sc = kind == 4 ? 1e-36 * exp(gauss() * 2) : exp(gauss() * 3);
    for (int64_t b = 0; b < n; b += 32) {
        const float amax = (float)(sc * (0.5 + unif()));
        for (int j = 0; j < 32; j++) {
            float v;
            switch (kind) {
            case 1: v = (float)((floor(unif() * 254) - 127 + 0.5) * amax / 127); break;
            case 2: v = ldexpf((float)(floor(unif() * 255) - 127), -(int)(unif() * 10)); break;
            case 3: v = (float)(gauss() * sc * (unif() < 0.02 ? 20 : 1)); break;
            case 4: v = (b / 32) % 4 == 0 ? 0.0f : (float)(gauss() * sc); break;
            default: v = (float)(gauss() * sc); break;
            }
            x[b + j] = v;
        }
        if (kind == 1) x[b + (int)(unif() * 32)] = unif() < 0.5 ? amax : -amax;
    }
}

static int passed, failed;

static void report(const char *what, long bad, long total)
{
    printf("%-58s %ld of %ld blocks differ\n", what, bad, total);
    if (bad) failed++; else passed++;
}

int main(int argc, char **argv)
{
    if (argc < 2) { fprintf(stderr, "usage: ggml_quant_check LIBDIR [VARIANT]\n"); return 2; }
    const char *variant = argc > 2 ? argv[2] : "haswell";
    char path[4096];
    snprintf(path, sizeof path, "%s/libggml-base.so", argv[1]);
    void *base = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    snprintf(path, sizeof path, "%s/libggml-cpu-%s.so", argv[1], variant);
    void *cpu = base ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!cpu) { fprintf(stderr, "ggml_quant_check: %s\n", dlerror()); return 3; }
    void (*cpu_init)(void) = (void (*)(void))dlsym(cpu, "ggml_cpu_init");
    if (cpu_init) cpu_init();

    const struct { int type; const char *name; } T[] = {
        { QTYPE_Q8_0, "q8_0" }, { QTYPE_Q8_1, "q8_1" }, { QTYPE_Q8_K, "q8_K" },
    };
    const int64_t n = 4096;
    const int rows = 400;
    float *x = malloc(n * sizeof *x);
    uint8_t *g = malloc(n * 4), *s = malloc(n * 4), *s2 = malloc(n * 4);
    if (!x || !g || !s || !s2) return 1;
    for (size_t t = 0; t < sizeof T / sizeof T[0]; t++) {
        char nm[64];
        snprintf(nm, sizeof nm, "quantize_row_%s", T[t].name);
        q_fn g_act = (q_fn)dlsym(cpu, nm);
        snprintf(nm, sizeof nm, "quantize_row_%s_ref", T[t].name);
        q_fn g_ref = (q_fn)dlsym(base, nm);
        if (!g_act || !g_ref) { fprintf(stderr, "ggml_quant_check: missing %s\n", nm); return 3; }
        const qtype_info *qi = qtype_get(T[t].type);
        const int64_t nb = n / qi->blck;
        for (int isa = 0; isa < 2; isa++) {
            quant_ops o;
            if (quant_ops_get(T[t].type, isa ? CPU_ISA_AVX2 : CPU_ISA_SCALAR, &o, NULL)) return 1;
            long bad_act = 0, bad_ref = 0, total = 0, ref_vs_act = 0;
            g_rng = 0x9E3779B97F4A7C15ull + (uint64_t)t;
            for (int r = 0; r < rows; r++) {
                fill(x, n, r % 5);
                g_act(x, g, n);
                o.act_quant(x, s, n);
                for (int64_t b = 0; b < nb; b++)
                    bad_act += memcmp(g + b * qi->type_size, s + b * qi->type_size, qi->type_size) != 0;
                /* ggml ref vs ggml act: how often they differ (information) */
                g_ref(x, s2, n);
                for (int64_t b = 0; b < nb; b++)
                    ref_vs_act += memcmp(g + b * qi->type_size, s2 + b * qi->type_size, qi->type_size) != 0;
                o.quant(x, s, n);
                for (int64_t b = 0; b < nb; b++)
                    bad_ref += memcmp(s2 + b * qi->type_size, s + b * qi->type_size, qi->type_size) != 0;
                total += nb;
            }
            char what[128];
            snprintf(what, sizeof what, "%s act_quant (%s) vs ggml-cpu-%s quantize_row_%s", T[t].name,
                     isa ? "avx2" : "scalar", variant, T[t].name);
            report(what, bad_act, total);
            snprintf(what, sizeof what, "%s quant (%s) vs ggml-base quantize_row_%s_ref", T[t].name,
                     isa ? "avx2" : "scalar", T[t].name);
            report(what, bad_ref, total);
            if (isa == 0)
                printf("  (ggml's own from_float vs _ref on this data: %ld of %ld blocks differ)\n", ref_vs_act, total);
        }
    }
    printf("ggml_quant: %d passed, %d failed\n", passed, failed);
    free(x); free(g); free(s); free(s2);
    return failed != 0;
}
