/* cpu: run-time CPU feature detection.
 * The binary is built for baseline x86-64; kernels compiled with -mavx2 live in
 * *_avx2.c files and are only called when cpu_detect() reports the features.
 * STRATA_ISA=scalar in the environment forces the scalar reference path (a
 * diagnostic that validates the release path; it changes no semantics). */
#ifndef STRATA_CPU_H
#define STRATA_CPU_H

typedef struct cpu_features {
    int avx2, fma, f16c, avx512f;
} cpu_features;

typedef enum cpu_isa {
    CPU_ISA_SCALAR = 0,
    CPU_ISA_AVX2   = 1,   /* AVX2 + FMA + F16C */
} cpu_isa;

/* Query CPUID. Pure function of the machine. */
cpu_features cpu_detect(void);

/* Best ISA this machine supports, lowered by STRATA_ISA=scalar. */
cpu_isa cpu_best_isa(void);

const char *cpu_isa_name(cpu_isa isa);

/* Number of online CPUs (>= 1). */
int cpu_count(void);

#endif
