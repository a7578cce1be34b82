/* cpu: see cpu.h. */
#include "util/cpu.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
static unsigned long long xgetbv0(void)
{
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif

cpu_features cpu_detect(void)
{
    cpu_features f = {0};
#if defined(__x86_64__) || defined(__i386__)
    unsigned int a, b, c, d;
    if (__get_cpuid(0, &a, &b, &c, &d))   /* vendor string "AuthenticAMD" in ebx, edx, ecx */
        f.amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    f.fma = (c >> 12) & 1;
    f.f16c = (c >> 29) & 1;
    int ymm_ok = 0, zmm_ok = 0;
    if (osxsave && avx) {
        unsigned long long x = xgetbv0();
        ymm_ok = (x & 6) == 6;
        zmm_ok = (x & 0xe6) == 0xe6;
    }
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        f.avx2 = ymm_ok && ((b >> 5) & 1);
        f.avx512f = zmm_ok && ((b >> 16) & 1);
        f.avx512 = f.avx512f && ((b >> 30) & 1) && ((b >> 31) & 1) && ((c >> 11) & 1);   /* BW, VL, VNNI */
        __cpuid_count(7, 1, a, b, c, d);
        f.avxvnni = ymm_ok && ((a >> 4) & 1);
    }
    if (!ymm_ok) f.fma = f.f16c = 0;
#endif
    return f;
}

cpu_isa cpu_best_isa(void)
{
    const char *env = getenv("STRATA_ISA");
    if (env && strcmp(env, "scalar") == 0) return CPU_ISA_SCALAR;
    cpu_features f = cpu_detect();
    if (!(f.avx2 && f.fma && f.f16c)) return CPU_ISA_SCALAR;
    if (env && strcmp(env, "avx2") == 0) return CPU_ISA_AVX2;
    /* the AVX-512 tier needs no AVX-VNNI: its 256-bit VNNI kernels are
     * EVEX-encoded (AMD Zen 4 has AVX-512 VNNI but not AVX-VNNI) */
    if (f.avx512 && !(env && strcmp(env, "avxvnni") == 0)) return CPU_ISA_AVX512;
    return f.avxvnni ? CPU_ISA_AVXVNNI : CPU_ISA_AVX2;
}

const char *cpu_isa_name(cpu_isa isa)
{
    return isa == CPU_ISA_AVX512    ? "avx512"
           : isa == CPU_ISA_AVXVNNI ? "avxvnni"
           : isa == CPU_ISA_AVX2    ? "avx2"
                                    : "scalar";
}

int cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}
