/* cpu: run-time CPU feature detection.
 * The binary is built for baseline x86-64; kernels compiled with -mavx2 live in
 * *_avx2.c files and are only called when cpu_detect() reports the features.
 * STRATA_ISA=scalar in the environment forces the scalar reference path,
 * STRATA_ISA=avx2 the AVX2 kernels without the AVX-VNNI ones, STRATA_ISA=avxvnni
 * without the AVX-512 ones (diagnostics that validate the release path on one
 * machine; they change no results: the AVX-VNNI and AVX-512 kernels are
 * bit-identical to the AVX2 ones). */
#ifndef STRATA_CPU_H
#define STRATA_CPU_H

typedef struct cpu_features {
    int avx2, fma, f16c, avx512f, avxvnni;
    int avx512;   /* AVX-512 F + BW + VL + VNNI with the OS saving zmm state */
    int amd;      /* vendor AuthenticAMD (a tuning hint: quant_ops.pf_rows) */
} cpu_features;

typedef enum cpu_isa {
    CPU_ISA_SCALAR = 0,
    CPU_ISA_AVX2   = 1,   /* AVX2 + FMA + F16C */
    CPU_ISA_AVXVNNI = 2,  /* the above + AVX-VNNI (256-bit vpdpwssd/vpdpbusd, VEX) */
    CPU_ISA_AVX512 = 3,   /* AVX2 + FMA + F16C + AVX-512 F/BW/VL/VNNI (AVX-VNNI not needed): 512-bit
                           * kernels where one exists, the 256-bit VNNI ones EVEX-encoded otherwise */
} cpu_isa;

/* Query CPUID. Pure function of the machine. */
cpu_features cpu_detect(void);

/* Best ISA this machine supports, lowered by STRATA_ISA=scalar|avx2|avxvnni
 * (avxvnni on a CPU without AVX-VNNI: avx2). */
cpu_isa cpu_best_isa(void);

const char *cpu_isa_name(cpu_isa isa);

/* Number of online CPUs (>= 1). */
int cpu_count(void);

#endif
