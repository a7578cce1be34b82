/* testhelp: a minimal C test framework (after redis' testhelp.h).
 *
 *   TEST(name) { CHECK(cond); CHECK_MSG(cond, "fmt", ...); }
 *   int main(void) { RUN(name); ...; return test_summary("gguf"); }
 *
 * Each TEST is one case; it fails if any CHECK in it fails (the first
 * failures are printed with file:line). test_summary prints
 * "<suite>: N passed, N failed" and returns the process exit code;
 * tests/run.sh adds the counts of every suite. */
#ifndef STRATA_TESTHELP_H
#define STRATA_TESTHELP_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

typedef struct test_state { int passed, failed, case_failed, n_reported; } test_state;
static test_state test_g;   /* the one global: test binaries only */

#define TEST(name) static void name(void)

#define CHECK_MSG(cond, ...) do { \
    if (!(cond)) { \
        test_g.case_failed = 1; \
        if (test_g.n_reported++ < 50) { \
            fprintf(stderr, "  FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); \
        } \
    } } while (0)

#define CHECK(cond) CHECK_MSG(cond, "%s", "")
#define CHECK_EQ_INT(a, b) do { long long a_ = (long long)(a), b_ = (long long)(b); \
    CHECK_MSG(a_ == b_, "%lld != %lld", a_, b_); } while (0)
#define CHECK_NEAR(a, b, tol) do { double a_ = (double)(a), b_ = (double)(b); \
    CHECK_MSG(fabs(a_ - b_) <= (tol), "%.9g vs %.9g (tol %.3g)", a_, b_, (double)(tol)); } while (0)

#define RUN(name) do { \
    test_g.case_failed = 0; \
    name(); \
    if (test_g.case_failed) { test_g.failed++; fprintf(stderr, "FAIL %s\n", #name); } \
    else { test_g.passed++; if (getenv("TEST_VERBOSE")) fprintf(stderr, "ok   %s\n", #name); } \
} while (0)

static inline int test_summary(const char *suite)
{
    printf("%s: %d passed, %d failed\n", suite, test_g.passed, test_g.failed);
    return test_g.failed ? 1 : 0;
}

#endif
