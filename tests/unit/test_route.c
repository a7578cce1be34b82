/* test_route: routing policy specs (parse, describe, errors with their
 * columns, model bounds) and the selection semantics on hand-made logit
 * rows (body kept, bias fills the rest, unbiased weights, exact-last, tail,
 * ties, counters), and that a policy without a bonus is the exact routing
 * bit for bit and never asks for residency. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "model/ops.h"
#include "route/route.h"
#include "testhelp.h"

/* ==== specs ==== */

static route_policy *parse_ok(const char *spec)
{
    route_policy *p = NULL;
    err e;
    err_clear(&e);
    int rc = route_policy_parse(&p, spec, &e);
    CHECK_MSG(rc == 0 && p, "'%s': %s", spec, e.msg);
    return p;
}

static void describe_is(const char *spec, const char *want)
{
    route_policy *p = parse_ok(spec);
    if (!p) return;
    char got[1024];
    route_policy_describe(p, got, sizeof got);
    CHECK_MSG(!strcmp(got, want), "'%s' -> '%s', wanted '%s'", spec, got, want);
    /* the canonical string reads back to itself */
    route_policy *q = parse_ok(got);
    if (q) {
        char again[1024];
        route_policy_describe(q, again, sizeof again);
        CHECK_MSG(!strcmp(again, got), "'%s' -> '%s'", got, again);
        CHECK(!memcmp(route_policy_arm(p, 0), route_policy_arm(q, 0), sizeof(route_arm) * ROUTE_N_ARMS));
    }
    route_policy_free(q);
    route_policy_free(p);
}

TEST(spec_good)
{
    describe_is("exact", "exact");
    describe_is("  exact ", "exact");
    describe_is("prompt=exact", "exact");
    describe_is("prompt=exact; decode=exact;", "exact");
    describe_is("prompt.chunk0=exact; prompt=bias(body=3,bonus=0.85,exact-last=32); decode=exact",
                "prompt.chunk0=exact; prompt=bias(body=3,bonus=0.85,exact-last=32); decode=exact");
    /* prompt.chunk0 falls back to prompt; decode defaults to exact */
    describe_is("prompt = bias( body = 2 , bonus = 0.5 )",
                "prompt.chunk0=bias(body=2,bonus=0.5); prompt=bias(body=2,bonus=0.5); decode=exact");
    describe_is("decode=bias(body=1,bonus=2); prompt.chunk0=bias(bonus=.25,body=0)",
                "prompt.chunk0=bias(body=0,bonus=0.25); prompt=exact; decode=bias(body=1,bonus=2)");
    describe_is("prompt=bias(body=3,bonus=0.85,exact-last=8,tail=64:0.25)",
                "prompt.chunk0=bias(body=3,bonus=0.85,exact-last=8,tail=64:0.25); "
                "prompt=bias(body=3,bonus=0.85,exact-last=8,tail=64:0.25); decode=exact");
    describe_is("prompt=bias(body=3,bonus=1e-3,exact-last=0)",
                "prompt.chunk0=bias(body=3,bonus=0.001); prompt=bias(body=3,bonus=0.001); decode=exact");
    describe_is("prompt=bias(body=3,bonus=0.1)",
                "prompt.chunk0=bias(body=3,bonus=0.1); prompt=bias(body=3,bonus=0.1); decode=exact");

    route_policy *p = parse_ok("prompt.chunk0=exact; prompt=bias(body=3,bonus=0.85,exact-last=32,tail=40:0.5)");
    if (p) {
        const route_arm *a = route_policy_arm(p, ROUTE_ARM_PROMPT);
        CHECK_EQ_INT(a->kind, ROUTE_BIAS);
        CHECK_EQ_INT(a->body, 3);
        CHECK(a->bonus == 0.85);
        CHECK_EQ_INT(a->exact_last, 32);
        CHECK_EQ_INT(a->tail_rows, 40);
        CHECK(a->tail_bonus == 0.5);
        CHECK_EQ_INT(route_policy_arm(p, ROUTE_ARM_CHUNK0)->kind, ROUTE_EXACT);
        CHECK_EQ_INT(route_policy_arm(p, ROUTE_ARM_DECODE)->kind, ROUTE_EXACT);
        CHECK(route_policy_arm(p, 3) == NULL);
    }
    route_policy_free(p);
    CHECK_EQ_INT(route_arm_for(0, 0), ROUTE_ARM_CHUNK0);
    CHECK_EQ_INT(route_arm_for(0, 5), ROUTE_ARM_PROMPT);
    CHECK_EQ_INT(route_arm_for(1, 0), ROUTE_ARM_DECODE);
}

/* spec -> an error whose message contains want */
static void bad(const char *spec, const char *want)
{
    route_policy *p = NULL;
    err e;
    err_clear(&e);
    int rc = route_policy_parse(&p, spec, &e);
    CHECK_MSG(rc == ERR_USAGE && !p, "'%s' parsed (rc %d)", spec, rc);
    CHECK_MSG(strstr(e.msg, want) != NULL, "'%s': message '%s' lacks '%s'", spec, e.msg, want);
    CHECK_MSG(!strncmp(e.msg, "route spec: ", 12), "'%s': '%s'", spec, e.msg);
    route_policy_free(p);
}

TEST(spec_errors)
{
    bad("prompt.chunk0=exact; prompt=biass(body=3,bonus=1)", "unknown arm 'biass' at column 29");
    bad("", "empty");
    bad("   ", "empty");
    bad("promt=exact", "unknown key (prompt.chunk0, prompt, decode) 'promt' at column 1");
    bad("prompt exact", "expected '=' after the key, got 'e' at column 8");
    bad("prompt=", "expected an arm (exact, bias(...)), got at the end (column 8)");
    bad("prompt=exact decode=exact", "expected ';' between clauses, got 'd' at column 14");
    bad("prompt=exact;; decode=exact", "got ';' at column 14");
    bad("prompt=exact; prompt=exact", "key given twice: 'prompt' at column 15");
    bad("bias(body=1,bonus=1)", "an arm needs a key (prompt.chunk0=, prompt=, decode=) before 'bias' at column 1");
    bad("exact;", "before 'exact' at column 1");
    bad("prompt=exact(1)", "exact takes no parameters: '(' at column 13");
    bad("prompt=bias", "expected '(' after bias, got at the end (column 12)");
    bad("prompt=bias(body=3,bonus=1", "expected ',' or ')' in bias(...), got at the end (column 27)");
    bad("prompt=bias(body=3;bonus=1)", "expected ',' or ')' in bias(...), got ';' at column 19");
    bad("prompt=bias(bodyy=3,bonus=1)", "unknown bias parameter (body, bonus, exact-last, tail) 'bodyy' at column 13");
    bad("prompt=bias(body=3,body=2,bonus=1)", "repeated parameter 'body' at column 20");
    bad("prompt=bias(body 3,bonus=1)", "expected '=' after the parameter name, got '3' at column 18");
    bad("prompt=bias(body=x,bonus=1)", "body needs a whole number from 0 to 1024, got 'x' at column 18");
    bad("prompt=bias(body=-1,bonus=1)", "got '-1' at column 18");
    bad("prompt=bias(body=2.5,bonus=1)", "got '2.5' at column 18");
    bad("prompt=bias(body=5000,bonus=1)", "from 0 to 1024, got '5000' at column 18");
    bad("prompt=bias(body=3,bonus=-0.5)", "bonus needs a finite number >= 0, got '-0.5' at column 26");
    bad("prompt=bias(body=3,bonus=inf)", "bonus needs a finite number >= 0, got 'i' at column 26");
    bad("prompt=bias(body=3,bonus=nan)", "got 'n' at column 26");
    bad("prompt=bias(body=3,bonus=1e999)", "got '1e999' at column 26");
    bad("prompt=bias(body=3,bonus=1..2)", "got '1..2' at column 26");
    bad("prompt=bias(bonus=1)", "bias needs body=B in 'bias(bonus=1)' at column 8");
    bad("prompt=bias(body=1)", "bias needs bonus=X in 'bias(body=1)' at column 8");
    bad("prompt=bias(body=1,bonus=1,exact-last=x)", "exact-last needs a whole number");
    bad("prompt=bias(body=1,bonus=1,tail=32)", "tail is ROWS:BONUS (e.g. tail=64:0.25): expected ':', got ')' at column 35");
    bad("prompt=bias(body=1,bonus=1,tail=0:1)", "tail rows needs a whole number from 1");
    bad("prompt=bias(body=1,bonus=1,tail=8:-1)", "tail bonus needs a finite number >= 0, got '-1' at column 35");
    bad("prompt=bias(body=1,bonus=1,exact-last=32,tail=16:0.5)", "tail rows must exceed exact-last");
    bad("prompt=bias(body=1,bonus=1,exact-last=32,tail=16:0.5)", "'tail' at column 42");
    bad("decode=bias(body=1,bonus=1,exact-last=4)", "decode rows are not prompt rows: no 'exact-last' at column 28");
    bad("decode=bias(body=1,bonus=1,tail=4:1)", "no 'tail' at column 28");
    bad("prompt=bias()", "expected a parameter (body, bonus, exact-last, tail), got ')' at column 13");
    bad("prompt=bias(body=1,bonus=1) x", "expected ';' between clauses, got 'x' at column 29");
    bad("prompt=bias(body=1,bonus=1,)", "got ')' at column 28");
    bad("prompt=\"exact\"", "expected an arm (exact, bias(...)), got '\"' at column 8");
    /* a long offending word is cut */
    bad("prompt=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "...' at column 8");
    {
        char big[ROUTE_MAX_SPEC + 8];
        memset(big, ' ', sizeof big - 1);
        big[sizeof big - 1] = '\0';
        bad(big, "longer than");
    }
    route_policy *p = NULL;
    err e;
    err_clear(&e);
    CHECK(route_policy_parse(&p, NULL, &e) == ERR_USAGE && !p);
}

TEST(spec_model_bounds)
{
    route_policy *p = parse_ok("prompt.chunk0=bias(body=8,bonus=1); prompt=bias(body=9,bonus=1)");
    if (!p) return;
    err e;
    err_clear(&e);
    CHECK(route_policy_check(p, 64, 9, &e) == 0);
    err_clear(&e);
    CHECK(route_policy_check(p, 64, 8, &e) == ERR_USAGE);
    CHECK_MSG(strstr(e.msg, "prompt: body=9 at column 54 is more than the model's 8 experts per token") != NULL,
              "%s", e.msg);
    route_policy_free(p);
    /* chunk0 inherited from prompt: the column of prompt's body */
    p = parse_ok("prompt=bias(body=4,bonus=1)");
    err_clear(&e);
    CHECK(route_policy_check(p, 8, 2, &e) == ERR_USAGE);
    CHECK_MSG(strstr(e.msg, "prompt.chunk0: body=4 at column 18") != NULL, "%s", e.msg);
    route_policy_free(p);
}

TEST(reads_residency)
{
    static const struct { const char *spec; int k; int want; } cases[] = {
        { "exact", 8, 0 },
        { "prompt=bias(body=3,bonus=0)", 8, 0 },
        { "prompt=bias(body=8,bonus=2)", 8, 0 },          /* body = k: nothing left to bias */
        { "prompt=bias(body=7,bonus=2)", 8, 1 },
        { "prompt=bias(body=3,bonus=0,tail=16:0)", 8, 0 },
        { "prompt=bias(body=3,bonus=0,tail=16:0.5)", 8, 1 },
        { "decode=bias(body=0,bonus=0.1)", 8, 1 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        route_policy *p = parse_ok(cases[i].spec);
        if (!p) continue;
        CHECK_MSG(route_policy_reads_residency(p, cases[i].k) == cases[i].want, "%s", cases[i].spec);
        route_policy_free(p);
    }
}

TEST(row_bonus)
{
    route_policy *p = parse_ok("prompt=bias(body=1,bonus=2,exact-last=4,tail=10:0.5); decode=bias(body=1,bonus=3)");
    if (!p) return;
    const route_arm *a = route_policy_arm(p, ROUTE_ARM_PROMPT);
    CHECK(route_row_bonus(a, 0, 0) == 0.0);
    CHECK(route_row_bonus(a, 0, 3) == 0.0);
    CHECK(route_row_bonus(a, 0, 4) == 0.5);
    CHECK(route_row_bonus(a, 0, 9) == 0.5);
    CHECK(route_row_bonus(a, 0, 10) == 2.0);
    CHECK(route_row_bonus(a, 0, 100000) == 2.0);
    CHECK(route_row_bonus(route_policy_arm(p, ROUTE_ARM_DECODE), 1, 0) == 3.0);
    route_arm ex = { 0 };
    CHECK(route_row_bonus(&ex, 0, 100) == 0.0);
    route_policy_free(p);
}

/* ==== selection ==== */

/* The architecture's routing as qwen3moe.c's route() writes it (the
 * reference the exact path must match bit for bit). */
static void old_route_row(float *p, int X, int K, int32_t *sel, float *w)
{
    ops_softmax(p, X);
    ops_topk(p, X, K, sel);
    double sum = 0.0;
    for (int t = 0; t < K; t++) { w[t] = p[sel[t]]; sum += (double)w[t]; }
    float fs = (float)sum;
    if (fs < 6.103515625e-5f) fs = 6.103515625e-5f;
    for (int t = 0; t < K; t++) w[t] = w[t] / fs;
}

typedef struct mask_src { const uint8_t *mask; int X; int calls; } mask_src;
static void mask_cb(void *ctx, uint8_t *mask)
{
    mask_src *m = ctx;
    m->calls++;
    memcpy(mask, m->mask, (size_t)m->X);
}

#define MX 16
#define MK 4
typedef struct work_buf {
    float logit[MX]; double key[MK]; int32_t exact[MK]; uint8_t mask[MX], seen[MX], seen_exact[MX];
    route_work w;
} work_buf;
static void work_init(work_buf *b)
{
    b->w = (route_work){ b->logit, b->key, b->exact, b->mask, b->seen, b->seen_exact };
}

/* One row through route_block with a one-arm policy. */
static int block_row(const char *spec, const float *logits, const uint8_t *res, int X, int K, int phase, int from_end,
                     int32_t *sel, float *w, float *probs, int *mask_calls, route_counters *ctr)
{
    route_policy *p = parse_ok(spec);
    if (!p) return -1;
    work_buf wb;
    work_init(&wb);
    float row[MX];
    memcpy(row, logits, sizeof(float) * (size_t)X);
    mask_src ms = { res, X, 0 };
    route_block(route_policy_arm(p, phase == 1 ? ROUTE_ARM_DECODE : ROUTE_ARM_PROMPT), phase, from_end, row, 1, X, K,
                sel, w, &wb.w, mask_cb, &ms, ctr);
    if (probs) memcpy(probs, row, sizeof(float) * (size_t)X);
    if (mask_calls) *mask_calls = ms.calls;
    route_policy_free(p);
    return 0;
}

static const float L8[8] = { 5.0f, 4.0f, 3.0f, 2.0f, 1.0f, 0.0f, -1.0f, -2.0f };

TEST(bias_fills_rest_body_kept)
{
    const uint8_t res[8] = { 0, 0, 0, 0, 0, 1, 1, 1 };   /* 5, 6, 7 resident */
    int32_t sel[4];
    float w[4], p[8];
    int calls = 0;
    /* delta = 7; bonus 1 adds 7 to the resident: scores 7, 6, 5 beat 3, 2 */
    block_row("prompt=bias(body=2,bonus=1)", L8, res, 8, 4, 0, 100, sel, w, p, &calls, NULL);
    CHECK_EQ_INT(calls, 1);
    CHECK_EQ_INT(sel[0], 0);
    CHECK_EQ_INT(sel[1], 1);
    CHECK_EQ_INT(sel[2], 5);   /* the fill in exact order: descending unbiased p */
    CHECK_EQ_INT(sel[3], 6);
    /* weights: the unbiased probabilities of the chosen, renormalised */
    float q[8];
    memcpy(q, L8, sizeof q);
    ops_softmax(q, 8);
    for (int i = 0; i < 8; i++) CHECK(p[i] == q[i]);   /* the router row holds the unbiased softmax */
    double sum = 0;
    for (int t = 0; t < 4; t++) sum += (double)q[sel[t]];
    for (int t = 0; t < 4; t++) CHECK(w[t] == q[sel[t]] / (float)sum);
    /* body 3: expert 2 stays whatever the bonus */
    block_row("prompt=bias(body=3,bonus=100)", L8, res, 8, 4, 0, 100, sel, w, NULL, NULL, NULL);
    CHECK(sel[0] == 0 && sel[1] == 1 && sel[2] == 2 && sel[3] == 5);
    /* body 0: all four slots from the biased order */
    block_row("prompt=bias(body=0,bonus=100)", L8, res, 8, 4, 0, 100, sel, w, NULL, NULL, NULL);
    CHECK(sel[0] == 0 && sel[1] == 5 && sel[2] == 6 && sel[3] == 7);
    /* a small bonus: 0.1 * 7 = 0.7 does not lift expert 5 (logit 0) over expert 3 (logit 2) */
    int32_t ex[4];
    float exw[4], row[8];
    memcpy(row, L8, sizeof row);
    old_route_row(row, 8, 4, ex, exw);
    block_row("prompt=bias(body=1,bonus=0.1)", L8, res, 8, 4, 0, 100, sel, w, NULL, &calls, NULL);
    CHECK_EQ_INT(calls, 1);
    for (int t = 0; t < 4; t++) { CHECK(sel[t] == ex[t]); CHECK(!memcmp(&w[t], &exw[t], sizeof(float))); }
    /* just enough: 0.3 * 7 = 2.1: expert 5 scores 2.1 > expert 3's 2 */
    block_row("prompt=bias(body=1,bonus=0.3)", L8, res, 8, 4, 0, 100, sel, w, NULL, NULL, NULL);
    CHECK(sel[0] == 0 && sel[1] == 1 && sel[2] == 2 && sel[3] == 5);
}

TEST(ties_lower_index)
{
    /* experts 1, 4, 6 tie (resident and equal logits): the lower index wins */
    const float l[8] = { 3.0f, 0.0f, 2.5f, 1.0f, 0.0f, -3.0f, 0.0f, -3.0f };
    const uint8_t res[8] = { 0, 1, 0, 0, 1, 0, 1, 0 };
    int32_t sel[4];
    float w[4];
    block_row("prompt=bias(body=2,bonus=10)", l, res, 8, 4, 0, 100, sel, w, NULL, NULL, NULL);
    CHECK(sel[0] == 0 && sel[1] == 2 && sel[2] == 1 && sel[3] == 4);
    /* exact ties go to the lower index too (ops_topk) */
    const float t[8] = { 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f };
    const uint8_t none[8] = { 0 };
    block_row("prompt=bias(body=1,bonus=1)", t, none, 8, 4, 0, 100, sel, w, NULL, NULL, NULL);
    CHECK(sel[0] == 0 && sel[1] == 1 && sel[2] == 2 && sel[3] == 3);
    /* a flat row has delta 0: the bonus changes nothing even for the resident */
    const uint8_t hi[8] = { 0, 0, 0, 0, 0, 0, 1, 1 };
    block_row("prompt=bias(body=1,bonus=5)", t, hi, 8, 4, 0, 100, sel, w, NULL, NULL, NULL);
    CHECK(sel[0] == 0 && sel[1] == 1 && sel[2] == 2 && sel[3] == 3);
}

TEST(all_resident_is_exact)
{
    /* with every expert resident the bias lifts all alike: exact order */
    const uint8_t all[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
    const float l[8] = { 0.3f, -1.2f, 2.2f, 0.9f, 0.91f, -0.5f, 1.7f, 0.0f };
    int32_t sel[4], ex[4];
    float w[4], exw[4], row[8];
    memcpy(row, l, sizeof row);
    old_route_row(row, 8, 4, ex, exw);
    block_row("prompt=bias(body=0,bonus=1000)", l, all, 8, 4, 0, 100, sel, w, NULL, NULL, NULL);
    CHECK(!memcmp(sel, ex, sizeof sel));
    CHECK(!memcmp(w, exw, sizeof w));
}

/* bonus 0, exact, body = k, and rows under exact-last: the old route()'s
 * bits, and the residency callback is never called */
TEST(no_bonus_is_exact_bits)
{
    float l[MX];
    uint32_t st = 12345;
    const uint8_t res[MX] = { 1, 0, 1, 0, 1, 0, 1, 0, 1, 1, 1, 1, 0, 0, 0, 1 };
    static const char *specs[] = {
        "exact", "prompt=bias(body=1,bonus=0)", "prompt=bias(body=4,bonus=9)",
        "prompt=bias(body=0,bonus=0,tail=50:0)", "prompt=bias(body=1,bonus=3,exact-last=1000)",
    };
    for (int trial = 0; trial < 200; trial++) {
        for (int i = 0; i < MX; i++) {
            st = st * 1103515245u + 12345u;
            l[i] = (float)((int)(st >> 8) % 2000 - 1000) / 97.0f;
            if (trial % 7 == 0 && i % 3 == 0) l[i] = l[0];   /* ties */
        }
        int32_t ex[MK];
        float exw[MK], exp_[MX];
        memcpy(exp_, l, sizeof exp_);
        old_route_row(exp_, MX, MK, ex, exw);
        for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
            int32_t sel[MK];
            float w[MK], p[MX];
            int calls = -1;
            block_row(specs[s], l, res, MX, MK, 0, trial % 40, sel, w, p, &calls, NULL);
            CHECK_MSG(calls == 0, "%s read residency", specs[s]);
            CHECK_MSG(!memcmp(sel, ex, sizeof sel) && !memcmp(w, exw, sizeof w) && !memcmp(p, exp_, sizeof p),
                      "%s differs from exact (trial %d)", specs[s], trial);
        }
        /* and route_exact_row is the same code */
        int32_t sel[MK];
        float w[MK], p[MX];
        memcpy(p, l, sizeof p);
        route_exact_row(p, MX, MK, sel, w);
        CHECK(!memcmp(sel, ex, sizeof sel) && !memcmp(w, exw, sizeof w));
    }
}

TEST(exact_last_and_tail)
{
    /* 6 rows, the block is the end of a prompt call with 2 rows after it:
     * rows_from_end = 7, 6, 5, 4, 3, 2. exact-last=4 -> rows 4, 5 exact;
     * tail=6:0 -> rows 2, 3 (from_end 5, 4) bonus 0; rows 0, 1 biased. */
    const uint8_t res[8] = { 0, 0, 0, 0, 0, 1, 1, 1 };
    route_policy *p = parse_ok("prompt=bias(body=2,bonus=1,exact-last=4,tail=6:0)");
    if (!p) return;
    float router[6 * 8];
    for (int j = 0; j < 6; j++) memcpy(router + j * 8, L8, sizeof L8);
    int32_t sel[6 * 4];
    float w[6 * 4];
    work_buf wb;
    work_init(&wb);
    mask_src ms = { res, 8, 0 };
    route_counters c;
    memset(&c, 0, sizeof c);
    route_block(route_policy_arm(p, ROUTE_ARM_PROMPT), 0, 2, router, 6, 8, 4, sel, w, &wb.w, mask_cb, &ms, &c);
    CHECK_EQ_INT(ms.calls, 1);
    for (int j = 0; j < 6; j++) {
        const int32_t *s = sel + j * 4;
        if (j < 2) CHECK_MSG(s[2] == 5 && s[3] == 6, "row %d biased: %d %d", j, s[2], s[3]);
        else CHECK_MSG(s[2] == 2 && s[3] == 3, "row %d exact: %d %d", j, s[2], s[3]);
    }
    CHECK_EQ_INT(c.blocks, 1);
    CHECK_EQ_INT(c.rows, 6);
    CHECK_EQ_INT(c.rows_biased, 2);
    CHECK_EQ_INT(c.slots_changed, 4);
    CHECK_EQ_INT(c.slots_changed_resident, 4);
    CHECK_EQ_INT(c.lookups, 6);        /* 0 1 2 3 5 6 */
    CHECK_EQ_INT(c.lookups_exact, 4);  /* 0 1 2 3 */
    CHECK_EQ_INT(c.masked_blocks, 1);
    CHECK_EQ_INT(c.masked_lookups, 6);
    CHECK_EQ_INT(c.masked_resident, 2);
    CHECK_EQ_INT(c.masked_lookups_exact, 4);
    CHECK_EQ_INT(c.masked_resident_exact, 0);

    /* a tail bonus of its own: tail rows biased with 1, others with 0 */
    route_policy_free(p);
    p = parse_ok("prompt=bias(body=2,bonus=0,tail=3:1)");
    for (int j = 0; j < 6; j++) memcpy(router + j * 8, L8, sizeof L8);
    ms.calls = 0;
    route_block(route_policy_arm(p, ROUTE_ARM_PROMPT), 0, 0, router, 6, 8, 4, sel, w, &wb.w, mask_cb, &ms, NULL);
    CHECK_EQ_INT(ms.calls, 1);
    for (int j = 0; j < 6; j++) {
        const int32_t *s = sel + j * 4;
        if (j >= 3) CHECK_MSG(s[2] == 5 && s[3] == 6, "row %d tail: %d %d", j, s[2], s[3]);
        else CHECK_MSG(s[2] == 2 && s[3] == 3, "row %d: %d %d", j, s[2], s[3]);
    }
    /* every row under exact-last: residency never read */
    route_policy_free(p);
    p = parse_ok("prompt=bias(body=2,bonus=1,exact-last=8)");
    for (int j = 0; j < 6; j++) memcpy(router + j * 8, L8, sizeof L8);
    ms.calls = 0;
    memset(&c, 0, sizeof c);
    route_block(route_policy_arm(p, ROUTE_ARM_PROMPT), 0, 2, router, 6, 8, 4, sel, w, &wb.w, mask_cb, &ms, &c);
    CHECK_EQ_INT(ms.calls, 0);
    CHECK_EQ_INT(c.masked_blocks, 0);
    CHECK_EQ_INT(c.rows_biased, 0);
    /* decode ignores row positions: biased */
    route_policy_free(p);
    p = parse_ok("decode=bias(body=2,bonus=1)");
    memcpy(router, L8, sizeof L8);
    ms.calls = 0;
    route_block(route_policy_arm(p, ROUTE_ARM_DECODE), 1, 0, router, 1, 8, 4, sel, w, &wb.w, mask_cb, &ms, NULL);
    CHECK_EQ_INT(ms.calls, 1);
    CHECK(sel[2] == 5 && sel[3] == 6);
    route_policy_free(p);
}

TEST(count_exact)
{
    const int32_t sel[3 * 2] = { 0, 1, 1, 2, 0, 5 };
    uint8_t seen[8];
    route_counters c;
    memset(&c, 0, sizeof c);
    route_count_exact(&c, sel, 3, 8, 2, seen);
    CHECK_EQ_INT(c.blocks, 1);
    CHECK_EQ_INT(c.rows, 3);
    CHECK_EQ_INT(c.lookups, 4);
    CHECK_EQ_INT(c.lookups_exact, 4);
    CHECK_EQ_INT(c.rows_biased, 0);
    route_count_exact(NULL, sel, 3, 8, 2, seen);   /* no-op */
    CHECK(route_work_bytes(8, 2) == 8 * 4 + 2 * 8 + 2 * 4 + 3 * 8);
}

int main(void)
{
    RUN(spec_good);
    RUN(spec_errors);
    RUN(spec_model_bounds);
    RUN(reads_residency);
    RUN(row_bonus);
    RUN(bias_fills_rest_body_kept);
    RUN(ties_lower_index);
    RUN(all_resident_is_exact);
    RUN(no_bonus_is_exact_bits);
    RUN(exact_last_and_tail);
    RUN(count_exact);
    return test_summary("route");
}
