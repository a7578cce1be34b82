/* route: see route.h and docs/ROUTING.md. */
#include "route/route.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/ops.h"

struct route_policy {
    route_arm arm[ROUTE_N_ARMS];     /* resolved: CHUNK0 is PROMPT's when not given */
    int       body_col[ROUTE_N_ARMS];/* column of body= in the spec (0: none), for route_policy_check */
};

/* ==== Parsing ==== */

typedef struct parser {
    const char *s;     /* the spec */
    size_t      i;     /* cursor */
    err        *e;
} parser;

static int col(const parser *ps, size_t at) { (void)ps; return (int)at + 1; }

static void skip_ws(parser *ps)
{
    while (ps->s[ps->i] == ' ' || ps->s[ps->i] == '\t' || ps->s[ps->i] == '\n' || ps->s[ps->i] == '\r') ps->i++;
}

/* "route spec: <what> '<text>' at column <c>": the text is s[at..at+n),
 * cut at 40 bytes; n == 0 names the end or the next character. */
static int fail_at(parser *ps, size_t at, size_t n, const char *what)
{
    const char *t = ps->s + at;
    if (n == 0) {
        if (!*t) return err_setf(ps->e, ERR_USAGE, "route spec: %s at the end (column %d)", what, col(ps, at));
        n = 1;
    }
    const int cut = n > 40 ? 40 : (int)n;
    return err_setf(ps->e, ERR_USAGE, "route spec: %s '%.*s%s' at column %d", what, cut, t, n > 40 ? "..." : "",
                    col(ps, at));
}

static int is_word(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.';
}

/* A word at the cursor: its start and length (0: none). */
static size_t word(parser *ps, size_t *start)
{
    skip_ws(ps);
    *start = ps->i;
    while (is_word(ps->s[ps->i])) ps->i++;
    return ps->i - *start;
}

static int word_is(const parser *ps, size_t at, size_t n, const char *w)
{
    return strlen(w) == n && !memcmp(ps->s + at, w, n);
}

/* A number token: digits, '.', 'e', 'E', '+', '-' (never "inf"/"nan"). */
static size_t num_token(parser *ps, size_t *start)
{
    skip_ws(ps);
    *start = ps->i;
    for (;;) {
        const char c = ps->s[ps->i];
        if ((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') ps->i++;
        else break;
    }
    return ps->i - *start;
}

static int parse_int(parser *ps, long lo, long hi, const char *name, int *out)
{
    size_t at, n = num_token(ps, &at);
    char buf[48];
    int ok = n > 0 && n < sizeof buf;
    for (size_t k = 0; ok && k < n; k++) ok = ps->s[at + k] >= '0' && ps->s[at + k] <= '9';
    long v = 0;
    if (ok) {
        memcpy(buf, ps->s + at, n);
        buf[n] = '\0';
        errno = 0;
        v = strtol(buf, NULL, 10);
        ok = errno == 0 && v >= lo && v <= hi;
    }
    if (!ok) {
        char what[96];
        snprintf(what, sizeof what, "%s needs a whole number from %ld to %ld, got", name, lo, hi);
        return fail_at(ps, at, n, what);
    }
    *out = (int)v;
    return 0;
}

static int parse_num(parser *ps, const char *name, double *out)
{
    size_t at, n = num_token(ps, &at);
    char buf[64];
    int ok = n > 0 && n < sizeof buf;
    double v = 0;
    if (ok) {
        memcpy(buf, ps->s + at, n);
        buf[n] = '\0';
        char *end;
        errno = 0;
        v = strtod(buf, &end);
        ok = *end == '\0' && errno == 0 && isfinite(v) && v >= 0;
    }
    if (!ok) {
        char what[96];
        snprintf(what, sizeof what, "%s needs a finite number >= 0, got", name);
        return fail_at(ps, at, n, what);
    }
    *out = v + 0.0;   /* -0 reads as 0 */
    return 0;
}

static int expect(parser *ps, char c, const char *what)
{
    skip_ws(ps);
    if (ps->s[ps->i] != c) return fail_at(ps, ps->i, 0, what);
    ps->i++;
    return 0;
}

/* bias(...) after the word "bias"; `decode`: exact-last and tail are errors. */
static int parse_bias(parser *ps, size_t arm_at, int decode, route_arm *a, int *body_col)
{
    int rc;
    if ((rc = expect(ps, '(', "expected '(' after bias, got"))) return rc;
    int have_body = 0, have_bonus = 0, have_last = 0, have_tail = 0;
    size_t last_at = 0, tail_at = 0;
    for (;;) {
        size_t at, n = word(ps, &at);
        if (n == 0) return fail_at(ps, at, 0, "expected a parameter (body, bonus, exact-last, tail), got");
        int *have;
        if (word_is(ps, at, n, "body")) have = &have_body;
        else if (word_is(ps, at, n, "bonus")) have = &have_bonus;
        else if (word_is(ps, at, n, "exact-last")) have = &have_last;
        else if (word_is(ps, at, n, "tail")) have = &have_tail;
        else return fail_at(ps, at, n, "unknown bias parameter (body, bonus, exact-last, tail)");
        if (*have) return fail_at(ps, at, n, "repeated parameter");
        *have = 1;
        if (decode && (have == &have_last || have == &have_tail))
            return fail_at(ps, at, n, "decode rows are not prompt rows: no");
        if ((rc = expect(ps, '=', "expected '=' after the parameter name, got"))) return rc;
        if (have == &have_body) {
            skip_ws(ps);
            *body_col = col(ps, ps->i);
            if ((rc = parse_int(ps, 0, ROUTE_MAX_BODY, "body", &a->body))) return rc;
        } else if (have == &have_bonus) {
            if ((rc = parse_num(ps, "bonus", &a->bonus))) return rc;
        } else if (have == &have_last) {
            last_at = at;
            if ((rc = parse_int(ps, 0, ROUTE_MAX_ROWS, "exact-last", &a->exact_last))) return rc;
        } else {
            tail_at = at;
            if ((rc = parse_int(ps, 1, ROUTE_MAX_ROWS, "tail rows", &a->tail_rows))) return rc;
            if ((rc = expect(ps, ':', "tail is ROWS:BONUS (e.g. tail=64:0.25): expected ':', got"))) return rc;
            if ((rc = parse_num(ps, "tail bonus", &a->tail_bonus))) return rc;
        }
        skip_ws(ps);
        if (ps->s[ps->i] == ',') { ps->i++; continue; }
        if (ps->s[ps->i] == ')') { ps->i++; break; }
        return fail_at(ps, ps->i, 0, "expected ',' or ')' in bias(...), got");
    }
    size_t end = ps->i;
    if (!have_body) return fail_at(ps, arm_at, end - arm_at, "bias needs body=B in");
    if (!have_bonus) return fail_at(ps, arm_at, end - arm_at, "bias needs bonus=X in");
    if (have_tail && a->tail_rows <= a->exact_last) {
        (void)last_at;
        return fail_at(ps, tail_at, 4, "tail rows must exceed exact-last (else the tail is all exact):");
    }
    a->kind = ROUTE_BIAS;
    return 0;
}

int route_policy_parse(route_policy **out, const char *spec, err *e)
{
    *out = NULL;
    if (!spec) return err_setf(e, ERR_USAGE, "route spec: none given");
    if (strlen(spec) > ROUTE_MAX_SPEC)
        return err_setf(e, ERR_USAGE, "route spec: longer than %d bytes", ROUTE_MAX_SPEC);
    parser ps = { spec, 0, e };
    route_arm arm[ROUTE_N_ARMS];
    int given[ROUTE_N_ARMS] = { 0 }, body_col[ROUTE_N_ARMS] = { 0 };
    memset(arm, 0, sizeof arm);
    skip_ws(&ps);
    if (!spec[ps.i]) return err_setf(e, ERR_USAGE, "route spec: empty (give exact or KEY=ARM; ...)");

    /* the whole spec "exact": every arm exact */
    size_t at0, n0 = word(&ps, &at0);
    skip_ws(&ps);
    if (word_is(&ps, at0, n0, "exact") && !spec[ps.i]) {
        route_policy *p = calloc(1, sizeof *p);
        if (!p) return err_setf(e, ERR_NOMEM, "out of memory");
        *out = p;
        return 0;
    }
    ps.i = 0;

    for (;;) {
        size_t at, n = word(&ps, &at);
        int id;
        if (n == 0) return fail_at(&ps, at, 0, "expected a key (prompt.chunk0, prompt, decode), got");
        if (word_is(&ps, at, n, "prompt.chunk0")) id = ROUTE_ARM_CHUNK0;
        else if (word_is(&ps, at, n, "prompt")) id = ROUTE_ARM_PROMPT;
        else if (word_is(&ps, at, n, "decode")) id = ROUTE_ARM_DECODE;
        else if (word_is(&ps, at, n, "exact") || word_is(&ps, at, n, "bias"))
            return fail_at(&ps, at, n, "an arm needs a key (prompt.chunk0=, prompt=, decode=) before");
        else return fail_at(&ps, at, n, "unknown key (prompt.chunk0, prompt, decode)");
        if (given[id]) return fail_at(&ps, at, n, "key given twice:");
        given[id] = 1;
        int rc = expect(&ps, '=', "expected '=' after the key, got");
        if (rc) return rc;
        size_t aat, an = word(&ps, &aat);
        if (an == 0) return fail_at(&ps, aat, 0, "expected an arm (exact, bias(...)), got");
        if (word_is(&ps, aat, an, "exact")) {
            arm[id].kind = ROUTE_EXACT;
            skip_ws(&ps);
            if (spec[ps.i] == '(') return fail_at(&ps, ps.i, 1, "exact takes no parameters:");
        } else if (word_is(&ps, aat, an, "bias")) {
            if ((rc = parse_bias(&ps, aat, id == ROUTE_ARM_DECODE, &arm[id], &body_col[id]))) return rc;
        } else {
            return fail_at(&ps, aat, an, "unknown arm");
        }
        skip_ws(&ps);
        if (!spec[ps.i]) break;
        if (spec[ps.i] != ';') return fail_at(&ps, ps.i, 0, "expected ';' between clauses, got");
        ps.i++;
        skip_ws(&ps);
        if (!spec[ps.i]) break;   /* one trailing ';' is fine */
    }
    if (!given[ROUTE_ARM_CHUNK0]) {
        arm[ROUTE_ARM_CHUNK0] = arm[ROUTE_ARM_PROMPT];
        body_col[ROUTE_ARM_CHUNK0] = body_col[ROUTE_ARM_PROMPT];
    }
    route_policy *p = calloc(1, sizeof *p);
    if (!p) return err_setf(e, ERR_NOMEM, "out of memory");
    memcpy(p->arm, arm, sizeof arm);
    memcpy(p->body_col, body_col, sizeof body_col);
    *out = p;
    return 0;
}

void route_policy_free(route_policy *p) { free(p); }

int route_policy_check(const route_policy *p, int n_expert, int k, err *e)
{
    if (k < 1 || k > n_expert) return err_setf(e, ERR_INTERNAL, "route: k %d of %d experts", k, n_expert);
    for (int id = 0; id < ROUTE_N_ARMS; id++) {
        const route_arm *a = &p->arm[id];
        if (a->kind == ROUTE_BIAS && a->body > k) {
            if (p->body_col[id] > 0)
                return err_setf(e, ERR_USAGE, "route spec: %s: body=%d at column %d is more than the model's %d "
                                "experts per token", route_arm_name(id), a->body, p->body_col[id], k);
            return err_setf(e, ERR_USAGE, "route spec: %s: body=%d is more than the model's %d experts per token",
                            route_arm_name(id), a->body, k);
        }
    }
    return 0;
}

const route_arm *route_policy_arm(const route_policy *p, int id)
{
    return id >= 0 && id < ROUTE_N_ARMS ? &p->arm[id] : NULL;
}

int route_arm_for(int phase, int chunk_index)
{
    if (phase == 1) return ROUTE_ARM_DECODE;
    return chunk_index == 0 ? ROUTE_ARM_CHUNK0 : ROUTE_ARM_PROMPT;
}

const char *route_arm_name(int id)
{
    return id == ROUTE_ARM_CHUNK0 ? "prompt.chunk0" : id == ROUTE_ARM_PROMPT ? "prompt"
         : id == ROUTE_ARM_DECODE ? "decode" : "?";
}

/* ==== Describing ==== */

/* The shortest %.{1..17}g that reads back to v. */
static void fmt_num(char *buf, size_t cap, double v)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

int route_arm_describe(const route_arm *a, char *buf, size_t cap)
{
    if (a->kind != ROUTE_BIAS) return snprintf(buf, cap, "exact");
    char b[40], tb[40], last[40] = "", tail[96] = "";
    fmt_num(b, sizeof b, a->bonus);
    if (a->exact_last > 0) snprintf(last, sizeof last, ",exact-last=%d", a->exact_last);
    if (a->tail_rows > 0) {
        fmt_num(tb, sizeof tb, a->tail_bonus);
        snprintf(tail, sizeof tail, ",tail=%d:%s", a->tail_rows, tb);
    }
    return snprintf(buf, cap, "bias(body=%d,bonus=%s%s%s)", a->body, b, last, tail);
}

int route_policy_describe(const route_policy *p, char *buf, size_t cap)
{
    int all_exact = 1;
    for (int id = 0; id < ROUTE_N_ARMS; id++) all_exact &= p->arm[id].kind == ROUTE_EXACT;
    if (all_exact) return snprintf(buf, cap, "exact");
    char a[ROUTE_N_ARMS][200];
    for (int id = 0; id < ROUTE_N_ARMS; id++) route_arm_describe(&p->arm[id], a[id], sizeof a[id]);
    return snprintf(buf, cap, "prompt.chunk0=%s; prompt=%s; decode=%s", a[0], a[1], a[2]);
}

int route_arm_reads_residency(const route_arm *a, int k)
{
    return a && a->kind == ROUTE_BIAS && a->body < k && (a->bonus > 0 || (a->tail_rows > 0 && a->tail_bonus > 0));
}

int route_policy_reads_residency(const route_policy *p, int k)
{
    for (int id = 0; id < ROUTE_N_ARMS; id++)
        if (route_arm_reads_residency(&p->arm[id], k)) return 1;
    return 0;
}

double route_row_bonus(const route_arm *a, int phase, int rows_from_end)
{
    if (a->kind != ROUTE_BIAS) return 0.0;
    if (phase == 1) return a->bonus;
    if (rows_from_end < a->exact_last) return 0.0;
    if (rows_from_end < a->tail_rows) return a->tail_bonus;
    return a->bonus;
}

/* ==== The per-row path ==== */

size_t route_work_bytes(int X, int k)
{
    return sizeof(float) * (size_t)X + sizeof(double) * (size_t)k + sizeof(int32_t) * (size_t)k + 3 * (size_t)X;
}

/* Divide the chosen probabilities by their sum (double, then float) clamped
 * at 2^-14: ggml_clamp(sum, 6.103515625e-5, inf), as route() does. */
static void weights_of(const float *p, const int32_t *sel, int k, float *w)
{
    double sum = 0.0;
    for (int t = 0; t < k; t++) { w[t] = p[sel[t]]; sum += (double)w[t]; }
    float fs = (float)sum;
    if (fs < 6.103515625e-5f) fs = 6.103515625e-5f;
    for (int t = 0; t < k; t++) w[t] = w[t] / fs;
}

void route_exact_row(float *p, int X, int k, int32_t *sel, float *w)
{
    ops_softmax(p, X);
    ops_topk(p, X, k, sel);
    weights_of(p, sel, k, w);
}

static int in_list(const int32_t *l, int n, int32_t x)
{
    for (int i = 0; i < n; i++)
        if (l[i] == x) return 1;
    return 0;
}

int route_bias_row(const float *logit, const float *p, const int32_t *exact, const uint8_t *resident,
                   int X, int k, int body, double b, int32_t *sel, float *w, double *key, int *changed_resident)
{
    float lo = logit[0], hi = logit[0];
    for (int e = 1; e < X; e++) {
        lo = logit[e] < lo ? logit[e] : lo;
        hi = logit[e] > hi ? logit[e] : hi;
    }
    const double bias = b * ((double)hi - (double)lo);
    /* the kept body, in exact order */
    for (int t = 0; t < body; t++) sel[t] = exact[t];
    /* the rest: best scores among the others, a descending list of at most
     * k - body (a new score goes after every kept score >= it: ties stay in
     * index order, as ops_topk) */
    const int want = k - body;
    int m = 0;
    for (int e = 0; e < X; e++) {
        if (in_list(exact, body, e)) continue;
        const double v = (double)logit[e] + (resident[e] ? bias : 0.0);
        if (m == want && !(v > key[want - 1])) continue;
        int j = m < want ? m++ : want - 1;
        while (j > 0 && v > key[j - 1]) { key[j] = key[j - 1]; sel[body + j] = sel[body + j - 1]; j--; }
        key[j] = v;
        sel[body + j] = e;
    }
    /* the exact order over the chosen set: descending p, ties to the lower
     * index (insertion sort; the body is already first and in order) */
    for (int t = body + 1; t < k; t++) {
        const int32_t x = sel[t];
        int j = t;
        while (j > 0 && (p[x] > p[sel[j - 1]] || (p[x] == p[sel[j - 1]] && x < sel[j - 1]))) { sel[j] = sel[j - 1]; j--; }
        sel[j] = x;
    }
    weights_of(p, sel, k, w);
    int changed = 0, cres = 0;
    for (int t = 0; t < k; t++)
        if (!in_list(exact, k, sel[t])) { changed++; cres += resident[sel[t]] != 0; }
    if (changed_resident) *changed_resident = cres;
    return changed;
}

static uint64_t count_set(const uint8_t *a, int X)
{
    uint64_t n = 0;
    for (int e = 0; e < X; e++) n += a[e] != 0;
    return n;
}

static uint64_t count_both(const uint8_t *a, const uint8_t *b, int X)
{
    uint64_t n = 0;
    for (int e = 0; e < X; e++) n += a[e] && b[e];
    return n;
}

void route_block(const route_arm *a, int phase, int rows_after, float *router, int n_rows, int X, int k,
                 int32_t *sel, float *w, route_work *wk, route_mask_fn mask_fn, void *mask_ctx,
                 route_counters *ctr)
{
    int masked = 0;
    if (ctr) {
        memset(wk->seen, 0, (size_t)X);
        memset(wk->seen_exact, 0, (size_t)X);
    }
    for (int j = 0; j < n_rows; j++) {
        float *p = router + (size_t)j * X;
        int32_t *s = sel + (size_t)j * k;
        float *ww = w + (size_t)j * k;
        const double b = a->body < k ? route_row_bonus(a, phase, (n_rows - 1 - j) + rows_after) : 0.0;
        if (!(b > 0)) {
            route_exact_row(p, X, k, s, ww);
            if (ctr) {
                ctr->rows++;
                for (int t = 0; t < k; t++) wk->seen[s[t]] = wk->seen_exact[s[t]] = 1;
            }
            continue;
        }
        memcpy(wk->logit, p, sizeof(float) * (size_t)X);
        ops_softmax(p, X);
        ops_topk(p, X, k, wk->exact);
        if (!masked) { mask_fn(mask_ctx, wk->mask); masked = 1; }
        int cres = 0;
        const int changed = route_bias_row(wk->logit, p, wk->exact, wk->mask, X, k, a->body, b, s, ww, wk->key, &cres);
        if (ctr) {
            ctr->rows++;
            ctr->rows_biased++;
            ctr->slots_changed += (uint64_t)changed;
            ctr->slots_changed_resident += (uint64_t)cres;
            for (int t = 0; t < k; t++) { wk->seen[s[t]] = 1; wk->seen_exact[wk->exact[t]] = 1; }
        }
    }
    if (!ctr) return;
    const uint64_t lk = count_set(wk->seen, X), lx = count_set(wk->seen_exact, X);
    ctr->blocks++;
    ctr->lookups += lk;
    ctr->lookups_exact += lx;
    if (masked) {
        ctr->masked_blocks++;
        ctr->masked_lookups += lk;
        ctr->masked_lookups_exact += lx;
        ctr->masked_resident += count_both(wk->seen, wk->mask, X);
        ctr->masked_resident_exact += count_both(wk->seen_exact, wk->mask, X);
    }
}

void route_count_exact(route_counters *ctr, const int32_t *sel, int n_rows, int X, int k, uint8_t *seen)
{
    if (!ctr) return;
    memset(seen, 0, (size_t)X);
    for (size_t r = 0; r < (size_t)n_rows * (size_t)k; r++) seen[sel[r]] = 1;
    const uint64_t lk = count_set(seen, X);
    ctr->blocks++;
    ctr->rows += (uint64_t)n_rows;
    ctr->lookups += lk;
    ctr->lookups_exact += lk;
}
