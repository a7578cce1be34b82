/* Unit tests for src/util: err, cursor, fp16 helpers, thread pool, cpu. */
#include "testhelp.h"

#include <stdint.h>
#include "util/cpu.h"
#include "util/cursor.h"
#include "util/err.h"
#include "util/fp16.h"
#include "util/threadpool.h"

TEST(test_err_first_wins)
{
    err e;
    err_clear(&e);
    CHECK_EQ_INT(err_setf(&e, ERR_IO, "first %d", 1), ERR_IO);
    CHECK_EQ_INT(err_setf(&e, ERR_FORMAT, "second"), ERR_FORMAT);
    CHECK_EQ_INT(e.code, ERR_IO);
    CHECK(strcmp(e.msg, "first 1") == 0);
    err_prefix(&e, "ctx");
    CHECK(strcmp(e.msg, "ctx: first 1") == 0);
    CHECK(strcmp(err_name(ERR_FORMAT), "ERR_FORMAT") == 0);
    CHECK_EQ_INT(err_setf(NULL, ERR_NOMEM, "x"), ERR_NOMEM);
}

TEST(test_cursor_bounds)
{
    uint8_t buf[10] = { 1, 0, 0, 0, 2, 0, 0, 0, 0, 0 };
    err e;
    err_clear(&e);
    cursor c;
    cursor_init(&c, buf, sizeof buf, 100, &e);
    CHECK_EQ_INT(cursor_u32(&c, "a"), 1);
    CHECK_EQ_INT(cursor_u32(&c, "b"), 2);
    CHECK(!c.failed);
    (void)cursor_u32(&c, "field c");
    CHECK(c.failed);
    CHECK(strstr(e.msg, "field c") != NULL);
    CHECK(strstr(e.msg, "108") != NULL);  /* file offset = base + pos */
    CHECK(cursor_take(&c, 1, "d") == NULL); /* sticky failure */
    cursor_init(&c, buf, sizeof buf, 0, NULL);
    CHECK(!cursor_has(&c, UINT64_MAX));
    c.pos = 5;
    CHECK(!cursor_has(&c, UINT64_MAX - 2));
    uint64_t out;
    CHECK(size_mul_ok(1ull << 40, 1ull << 30, &out) == -1);
    CHECK(size_add_ok(UINT64_MAX, 1, &out) == -1);
    CHECK(size_mul_ok(3, 5, &out) == 0 && out == 15);
}

TEST(test_fp16_roundtrip)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fp16_to_fp32((uint16_t)h);
        if (f != f) continue;
        if (fp32_to_fp16(f) != h) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(fp32_to_fp16(65520.0f) == 0x7c00);      /* rounds to inf */
    CHECK(fp32_to_fp16(65519.0f) == 0x7bff);
    CHECK(fp32_to_fp16(1.0f + 1.0f / 2048) == 0x3c00); /* tie to even */
    CHECK(fp32_to_fp16(5.9604645e-8f) == 0x0001);
    CHECK(fp32_to_fp16(2.9802322e-8f) == 0x0000);  /* exact half of min subnormal: even */
    CHECK(fp32_to_bf16(1.0f) == 0x3f80);
    CHECK(bf16_to_fp32(0x3f80) == 1.0f);
    CHECK(fp32_to_bf16(fp32_from_bits(0x3f808000u)) == 0x3f80);  /* tie to even */
    CHECK(fp32_to_bf16(fp32_from_bits(0x3f818000u)) == 0x3f82);
}

typedef struct { long n; long *out; } sum_job;
static void sum_fn(void *ctx, int ith, int nth)
{
    sum_job *j = ctx;
    long lo, hi, s = 0;
    tpool_split(j->n, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++) s += i;
    j->out[ith] = s;
}

TEST(test_threadpool)
{
    for (int nt = 1; nt <= 4; nt++) {
        tpool *p;
        err e;
        err_clear(&e);
        CHECK(tpool_open(&p, nt, &e) == 0);
        long out[4] = { 0 };
        sum_job j = { 100000, out };
        for (int rep = 0; rep < 200; rep++) {
            tpool_run(p, sum_fn, &j);
            long s = 0;
            for (int i = 0; i < nt; i++) s += out[i];
            if (s != 100000L * 99999 / 2) { CHECK_MSG(0, "threads %d rep %d sum %ld", nt, rep, s); break; }
        }
        CHECK_EQ_INT(tpool_size(p), nt);
        tpool_close(p);
    }
    tpool *p;
    CHECK(tpool_open(&p, 0, NULL) == ERR_USAGE);
    tpool_close(NULL);
}

TEST(test_split_covers)
{
    for (int nth = 1; nth < 7; nth++)
        for (long n = 0; n < 20; n++) {
            long prev = 0;
            for (int i = 0; i < nth; i++) {
                long lo, hi;
                tpool_split(n, i, nth, &lo, &hi);
                CHECK(lo == prev && hi >= lo);
                prev = hi;
            }
            CHECK(prev == n);
        }
}

TEST(test_cpu)
{
    cpu_features f = cpu_detect();
    CHECK(cpu_count() >= 1);
    cpu_isa isa = cpu_best_isa();
    CHECK(isa == CPU_ISA_SCALAR || (f.avx2 && f.fma && f.f16c));
}

int main(void)
{
    RUN(test_err_first_wins);
    RUN(test_cursor_bounds);
    RUN(test_fp16_roundtrip);
    RUN(test_threadpool);
    RUN(test_split_covers);
    RUN(test_cpu);
    return test_summary("util");
}
