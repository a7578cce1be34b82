// Burst read probe: how fast does a cold read of S bytes (not in L2) finish,
// measured inside the kernel (globaltimer: first CTA start to last CTA end)?
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
__device__ unsigned long long g_t0, g_t1;
__device__ unsigned g_sink;
__device__ __forceinline__ unsigned long long now() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
// each thread: U 16-byte loads in flight, CTA covers a contiguous chunk
template <int U>
__global__ void __launch_bounds__(256) k_burst(const uint4 *__restrict__ p, size_t n16, int pf)
{
    const unsigned long long t = now();
    if (threadIdx.x == 0) atomicMin(&g_t0, t);
    const size_t per = (size_t)256 * U;
    const size_t base = (size_t)blockIdx.x * per;
    if (pf) { // L2 prefetch of the CTA's chunk first
        const char *c = (const char *)(p + base);
        for (size_t a = threadIdx.x * 128; a < per * 16; a += 256 * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(c + a));
    }
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; u++) { size_t i = base + threadIdx.x + 256 * u; v[u] = i < n16 ? p[i] : make_uint4(0,0,0,0); }
    unsigned x = 0;
#pragma unroll
    for (int u = 0; u < U; u++) x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    if (x == 0x12345678u) g_sink = x;
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(&g_t1, now());
}
// the direct matvec's Q4_K whole-block pattern: 8 warps x 4 rows x 8 lanes,
// lane = sl * 4 + row; a lane loads its block (144 B: 9 x 16 B) of its row
__global__ void __launch_bounds__(256) k_q4k(const uint8_t *__restrict__ p, size_t nbytes)
{
    const unsigned long long t = now();
    if (threadIdx.x == 0) atomicMin(&g_t0, t);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, row = lane & 3, sl = lane >> 2;
    const size_t r = (size_t)blockIdx.x * 32 + warp * 4 + row;
    const uint8_t *b = p + r * 1152 + sl * 144;
    uint4 v[9];
#pragma unroll
    for (int j = 0; j < 9; j++) v[j] = (r + 1) * 1152 <= nbytes ? *(const uint4 *)(b + 16 * j) : make_uint4(0, 0, 0, 0);
    unsigned x = 0;
#pragma unroll
    for (int j = 0; j < 9; j++) x ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    if (x == 0x12345678u) g_sink = x;
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(&g_t1, now());
}
__global__ void k_flush(const uint4 *p, size_t n16) {
    unsigned x = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x) x ^= p[i].x;
    if (x == 0x12345678u) g_sink = x;
}
int main()
{
    const size_t total = (size_t)3 << 30;
    uint4 *buf; if (cudaMalloc(&buf, total)) { printf("malloc failed\n"); return 1; }
    cudaMemset(buf, 1, total);
    const size_t flush_off = (size_t)2 << 30, flush_n16 = ((size_t)512 << 20) / 16;
    const double sizes_mb[] = { 4.4, 8.9, 14.2, 42.5, 128 };
    printf("burst: | MB | U | L2 prefetch | CTAs | median us | GB/s (median) | best GB/s |\n");
    for (double mb : sizes_mb) for (int U : {9}) for (int pf = 0; pf < 2; pf++) {
        const size_t n16 = (size_t)(mb * 1e6 / 16) & ~(size_t)255;
        const size_t per = 256 * (size_t)U;
        const unsigned ctas = (unsigned)((n16 + per - 1) / per);
        double us[15]; int nt = 15;
        for (int t = 0; t < nt; t++) {
            k_flush<<<528, 256>>>(buf + flush_off / 16, flush_n16);
            const unsigned long long big = ~0ull, zero = 0;
            cudaMemcpyToSymbol(g_t0, &big, 8); cudaMemcpyToSymbol(g_t1, &zero, 8);
            const uint4 *src = buf + (((size_t)t * 128 << 20) / 16);   // a different region each trial
            if (U == 9) k_burst<9><<<ctas, 256>>>(src, n16, pf); else k_burst<18><<<ctas, 256>>>(src, n16, pf);
            cudaDeviceSynchronize();
            unsigned long long a, b; cudaMemcpyFromSymbol(&a, g_t0, 8); cudaMemcpyFromSymbol(&b, g_t1, 8);
            us[t] = (b - a) / 1e3;
        }
        for (int i = 1; i < nt; i++) for (int j = i; j > 0 && us[j] < us[j-1]; j--) { double x = us[j]; us[j] = us[j-1]; us[j-1] = x; }
        const double bytes = n16 * 16.0;
        printf("burst: | %.1f | %d | %d | %u | %.2f | %.0f | %.0f |\n", bytes / 1e6, U, pf, ctas, us[nt/2], bytes / us[nt/2] / 1e3, bytes / us[0] / 1e3);
    }
    for (double mb : { 4.4, 8.9, 14.2, 42.5 }) {
        const size_t rows = (size_t)(mb * 1e6 / 1152) & ~(size_t)31;
        const unsigned ctas = (unsigned)(rows / 32);
        double us[15]; int nt = 15;
        for (int t = 0; t < nt; t++) {
            k_flush<<<528, 256>>>(buf + flush_off / 16, flush_n16);
            const unsigned long long big = ~0ull, zero = 0;
            cudaMemcpyToSymbol(g_t0, &big, 8); cudaMemcpyToSymbol(g_t1, &zero, 8);
            const uint8_t *src = (const uint8_t *)buf + ((size_t)t * 128 << 20);
            k_q4k<<<ctas, 256>>>(src, rows * 1152);
            cudaDeviceSynchronize();
            unsigned long long a, b; cudaMemcpyFromSymbol(&a, g_t0, 8); cudaMemcpyFromSymbol(&b, g_t1, 8);
            us[t] = (b - a) / 1e3;
        }
        for (int i = 1; i < nt; i++) for (int j = i; j > 0 && us[j] < us[j-1]; j--) { double x = us[j]; us[j] = us[j-1]; us[j-1] = x; }
        const double bytes = rows * 1152.0;
        printf("q4k-pattern: | %.1f | %u CTAs | %.2f us | %.0f GB/s | best %.0f |\n", bytes / 1e6, ctas, us[nt/2], bytes / us[nt/2] / 1e3, bytes / us[0] / 1e3);
    }
    cudaError_t e = cudaGetLastError();
    printf("burst: %s\n", cudaGetErrorString(e));
    return 0;
}
