/* diskread: the disk's random-read ceiling for expert streaming.
 *
 * Random O_DIRECT reads of one size at one queue depth from a file, through
 * io_uring (liburing) or, with --pread, through QD threads each issuing pread.
 * Time is cut into short windows; each window's GB/s is bytes completed in it
 * over its length. Prints every window and the median with min..max, and one
 * machine-readable line:
 *   diskread size=B qd=N windows=W median_gbs=X min_gbs=Y max_gbs=Z reads=R
 *
 *   diskread FILE [--size B] [--qd N] [--windows W] [--window-ms MS] [--seed S]
 *            [--stride B] [--base OFF] [--span B] [--pread] [--quiet]
 *   diskread --drop FILE     evict FILE's pages from the page cache (fadvise)
 *
 * Offsets are base + k * stride (default base 0, stride 4096; give the blob size
 * and the first blob's offset to read whole blobs as the engine does), k chosen
 * uniformly so that the read stays in the file (or, with --span B, in the first
 * B bytes after base: a small span shows what re-reading a hot set costs); the buffer is 4096-aligned. Only a fixed set of windows is measured, so
 * the run takes about windows x window-ms.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (uint64_t)v;
}

static uint64_t g_size, g_slots; /* read size (rounded to 4096), number of offsets */
static uint64_t g_stride = 4096, g_base, g_span; /* offsets are g_base + k * g_stride */

static off_t pick_offset(uint64_t *rng) { return (off_t)(g_base + (rng_next(rng) % g_slots) * g_stride); }

/* ---- pread mode: QD threads, each a loop of preads; bytes counted atomically */
static atomic_ullong g_bytes;
static atomic_int g_stop;
static int g_fd;

static void *pread_worker(void *arg) {
    uint64_t rng = (uint64_t)(uintptr_t)arg;
    void *buf;
    if (posix_memalign(&buf, 4096, g_size)) return NULL;
    while (!atomic_load(&g_stop)) {
        ssize_t r = pread(g_fd, buf, g_size, pick_offset(&rng));
        if (r <= 0) { perror("pread"); break; }
        atomic_fetch_add(&g_bytes, (unsigned long long)r);
    }
    free(buf);
    return NULL;
}

static void usage(void) {
    fprintf(stderr,
            "usage: diskread FILE [--size B] [--qd N] [--windows W] [--window-ms MS] [--seed S]\n"
            "                [--stride B] [--base OFF] [--span B] [--pread] [--quiet]\n"
            "       diskread --drop FILE   (evict FILE from the page cache)\n");
}

int main(int argc, char **argv) {
    const char *path = NULL;
    uint64_t size = 1769472;
    int qd = 4, windows = 20, window_ms = 500, use_pread = 0, quiet = 0, drop = 0;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--size") && i + 1 < argc) size = parse_size(argv[++i]);
        else if (!strcmp(a, "--qd") && i + 1 < argc) qd = atoi(argv[++i]);
        else if (!strcmp(a, "--windows") && i + 1 < argc) windows = atoi(argv[++i]);
        else if (!strcmp(a, "--window-ms") && i + 1 < argc) window_ms = atoi(argv[++i]);
        else if (!strcmp(a, "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(a, "--stride") && i + 1 < argc) g_stride = parse_size(argv[++i]);
        else if (!strcmp(a, "--base") && i + 1 < argc) g_base = parse_size(argv[++i]);
        else if (!strcmp(a, "--span") && i + 1 < argc) g_span = parse_size(argv[++i]);
        else if (!strcmp(a, "--pread")) use_pread = 1;
        else if (!strcmp(a, "--quiet")) quiet = 1;
        else if (!strcmp(a, "--drop")) drop = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); return 0; }
        else if (a[0] == '-') { usage(); return 2; }
        else path = a;
    }
    if (!path) { usage(); return 2; }

    if (drop) {
        int fd = open(path, O_RDONLY);
        if (fd < 0) { perror(path); return 1; }
        int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
        if (rc) { fprintf(stderr, "diskread: fadvise: %s\n", strerror(rc)); return 1; }
        return 0;
    }

    if (qd < 1 || qd > 256 || windows < 1 || window_ms < 10 || size == 0 || g_stride == 0 || g_stride % 4096 ||
        g_base % 4096) { usage(); return 2; }
    g_size = (size + 4095) & ~(uint64_t)4095;
    int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0) { perror(path); return 1; }
    struct stat st;
    if (fstat(fd, &st) || (uint64_t)st.st_size < g_base + g_size + 4096) {
        fprintf(stderr, "diskread: %s is smaller than one read\n", path);
        return 1;
    }
    g_slots = ((uint64_t)st.st_size - g_base - g_size) / g_stride + 1;
    if (g_span && g_span / g_stride < g_slots) g_slots = g_span / g_stride ? g_span / g_stride : 1;
    g_fd = fd;

    double *gbs = calloc((size_t)windows, sizeof *gbs);
    unsigned long long total_reads = 0;
    double win = window_ms / 1000.0;

    if (use_pread) {
        pthread_t *th = calloc((size_t)qd, sizeof *th);
        for (int i = 0; i < qd; i++)
            pthread_create(&th[i], NULL, pread_worker, (void *)(uintptr_t)(seed * 1000003u + (uint64_t)i));
        for (int w = 0; w < windows; w++) {
            unsigned long long b0 = atomic_load(&g_bytes);
            double t0 = now_s();
            struct timespec ts = {window_ms / 1000, (long)(window_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
            double t1 = now_s();
            unsigned long long b1 = atomic_load(&g_bytes);
            gbs[w] = (double)(b1 - b0) / (t1 - t0) / 1e9;
            if (!quiet) fprintf(stderr, "window %2d: %.3f GB/s\n", w, gbs[w]);
        }
        atomic_store(&g_stop, 1);
        for (int i = 0; i < qd; i++) pthread_join(th[i], NULL);
        total_reads = atomic_load(&g_bytes) / g_size;
        free(th);
    } else {
        struct io_uring ring;
        int rc = io_uring_queue_init((unsigned)qd, &ring, 0);
        if (rc < 0) { fprintf(stderr, "diskread: io_uring_queue_init: %s\n", strerror(-rc)); return 1; }
        void **bufs = calloc((size_t)qd, sizeof *bufs);
        for (int i = 0; i < qd; i++)
            if (posix_memalign(&bufs[i], 4096, g_size)) { fprintf(stderr, "diskread: out of memory\n"); return 1; }
        uint64_t rng = seed;
        for (int i = 0; i < qd; i++) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            io_uring_prep_read(sqe, fd, bufs[i], (unsigned)g_size, (uint64_t)pick_offset(&rng));
            io_uring_sqe_set_data(sqe, (void *)(uintptr_t)i);
        }
        io_uring_submit(&ring);
        for (int w = 0; w < windows; w++) {
            double t0 = now_s(), t1 = t0;
            unsigned long long bytes = 0;
            while ((t1 = now_s()) - t0 < win) {
                struct io_uring_cqe *cqe;
                rc = io_uring_wait_cqe(&ring, &cqe);
                if (rc < 0) { fprintf(stderr, "diskread: wait: %s\n", strerror(-rc)); return 1; }
                int i = (int)(uintptr_t)io_uring_cqe_get_data(cqe);
                int res = cqe->res;
                io_uring_cqe_seen(&ring, cqe);
                if (res < 0) { fprintf(stderr, "diskread: read: %s\n", strerror(-res)); return 1; }
                bytes += (unsigned long long)res;
                total_reads++;
                struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
                io_uring_prep_read(sqe, fd, bufs[i], (unsigned)g_size, (uint64_t)pick_offset(&rng));
                io_uring_sqe_set_data(sqe, (void *)(uintptr_t)i);
                io_uring_submit(&ring);
            }
            /* completion-counted: a read is credited to the window it completes in */
            gbs[w] = (double)bytes / (t1 - t0) / 1e9;
            if (!quiet) fprintf(stderr, "window %2d: %.3f GB/s\n", w, gbs[w]);
        }
        /* drain what is still in flight */
        for (int i = 0; i < qd; i++) {
            struct io_uring_cqe *cqe;
            if (io_uring_wait_cqe(&ring, &cqe) == 0) io_uring_cqe_seen(&ring, cqe);
        }
        io_uring_queue_exit(&ring);
        for (int i = 0; i < qd; i++) free(bufs[i]);
        free(bufs);
    }
    close(fd);

    double *sorted = malloc((size_t)windows * sizeof *sorted);
    memcpy(sorted, gbs, (size_t)windows * sizeof *sorted);
    qsort(sorted, (size_t)windows, sizeof *sorted, cmp_d);
    double med = windows % 2 ? sorted[windows / 2] : 0.5 * (sorted[windows / 2 - 1] + sorted[windows / 2]);
    if (!quiet)
        printf("random %s reads of %llu bytes at QD %d: median %.3f GB/s (min..max %.3f..%.3f) over %d windows of %d ms\n",
               use_pread ? "pread" : "io_uring O_DIRECT", (unsigned long long)g_size, qd, med, sorted[0],
               sorted[windows - 1], windows, window_ms);
    printf("diskread size=%llu qd=%d windows=%d median_gbs=%.4f min_gbs=%.4f max_gbs=%.4f reads=%llu\n",
           (unsigned long long)g_size, qd, windows, med, sorted[0], sorted[windows - 1], total_reads);
    free(sorted);
    free(gbs);
    return 0;
}
