/* test_sampler: the sampler chain's pinned behaviour: the mt19937 stream,
 * greedy argmax (first max wins), top-k = 1, seed determinism, the top-p
 * and min-p cuts, the repeat penalty's signs and window, and that draws
 * follow the softmax. */
#include "testhelp.h"

#include "engine.h"
#include "runtime/sampler.h"

static sampler *open_s(sampler_opts o, int n_vocab)
{
    sampler *sm = NULL;
    err e;
    err_clear(&e);
    if (sampler_open(&sm, &o, n_vocab, &e) != 0) fprintf(stderr, "sampler_open: %s\n", e.msg);
    return sm;
}

static sampler_opts plain(float temp)
{
    sampler_opts o = sampler_default_opts();
    o.temp = temp;
    o.top_k = 0;
    o.top_p = 1.0f;
    o.min_p = 0.0f;
    o.seed = 42;
    return o;
}

TEST(mt19937_reference_values)
{
    /* The C++ standard's check: the 10000th output of a default-seeded
     * (5489) mt19937 is 4123659995. */
    sampler_mt r;
    sampler_mt_seed(&r, 5489u);
    CHECK_EQ_INT(sampler_mt_next(&r), 3499211612u);
    for (int i = 1; i < 9999; i++) sampler_mt_next(&r);
    CHECK_EQ_INT(sampler_mt_next(&r), 4123659995u);
    sampler_mt_seed(&r, 1u);
    for (int i = 0; i < 10000; i++) {
        double u = sampler_mt_uniform(&r);
        CHECK(u >= 0.0 && u < 1.0);
    }
    /* generate_canonical: (g1 + g2 * 2^32) / 2^64 */
    sampler_mt a, b;
    sampler_mt_seed(&a, 7u);
    sampler_mt_seed(&b, 7u);
    double g1 = sampler_mt_next(&b), g2 = sampler_mt_next(&b);
    CHECK(sampler_mt_uniform(&a) == (g1 + g2 * 4294967296.0) / 18446744073709551616.0);
}

TEST(greedy_argmax_first_max_wins)
{
    sampler *sm = open_s(plain(0.0f), 6);
    const float l[6] = { 0.5f, 3.0f, -1.0f, 3.0f, 2.9f, 3.0f };
    for (int i = 0; i < 5; i++) CHECK_EQ_INT(sampler_sample(sm, l), 1);
    sampler_close(sm);
    sm = open_s(plain(-1.0f), 3);   /* any temp <= 0 is greedy */
    const float m[3] = { -5.0f, -4.0f, -4.5f };
    CHECK_EQ_INT(sampler_sample(sm, m), 1);
    sampler_close(sm);
}

TEST(top_k_one_is_argmax)
{
    sampler_opts o = sampler_default_opts();   /* temp 0.8, top-p/min-p on */
    o.top_k = 1;
    o.seed = 3;
    sampler *sm = open_s(o, 100);
    float l[100];
    for (int i = 0; i < 100; i++) l[i] = (float)((i * 37) % 100) / 50.0f;   /* max at i = 27 (27*37 = 999) */
    for (int t = 0; t < 200; t++) CHECK_EQ_INT(sampler_sample(sm, l), 27);
    sampler_close(sm);
}

TEST(seed_determinism)
{
    float l[50];
    for (int i = 0; i < 50; i++) l[i] = (float)(i % 7) * 0.3f;
    sampler_opts o = sampler_default_opts();
    o.top_k = 0; o.top_p = 1.0f; o.min_p = 0.0f; o.temp = 1.5f;
    int32_t a[300], b[300], c[300];
    for (int run = 0; run < 3; run++) {
        o.seed = run == 2 ? 1234u : 1233u;
        sampler *sm = open_s(o, 50);
        int32_t *dst = run == 0 ? a : run == 1 ? b : c;
        for (int t = 0; t < 300; t++) dst[t] = sampler_sample(sm, l);
        sampler_close(sm);
    }
    int same_ab = 1, same_ac = 1;
    for (int t = 0; t < 300; t++) { same_ab &= a[t] == b[t]; same_ac &= a[t] == c[t]; }
    CHECK(same_ab);
    CHECK(!same_ac);
}

/* Logits whose softmax is p. */
static void logits_of(const double *p, int n, float *l)
{
    for (int i = 0; i < n; i++) l[i] = (float)log(p[i]);
}

TEST(top_p_keeps_the_mass)
{
    const double p[5] = { 0.10, 0.45, 0.25, 0.15, 0.05 };
    float l[5];
    logits_of(p, 5, l);
    sampler_opts o = plain(1.0f);
    o.top_p = 0.6f;   /* 0.45 + 0.25 >= 0.6: tokens 1 and 2 */
    sampler *sm = open_s(o, 5);
    int hits[5] = { 0 };
    for (int t = 0; t < 3000; t++) hits[sampler_sample(sm, l)]++;
    CHECK_EQ_INT(hits[0] + hits[3] + hits[4], 0);
    CHECK(hits[1] > hits[2] && hits[2] > 500);
    /* renormalised over the kept set: 0.45 / 0.70 */
    CHECK_NEAR(hits[1] / 3000.0, 0.45 / 0.70, 0.04);
    sampler_close(sm);
    o.top_p = 0.45f;  /* the top token alone reaches it */
    sm = open_s(o, 5);
    for (int t = 0; t < 200; t++) CHECK_EQ_INT(sampler_sample(sm, l), 1);
    sampler_close(sm);
}

TEST(min_p_cuts_relative_to_max)
{
    const double p[6] = { 0.40, 0.30, 0.019, 0.021, 0.2, 0.06 };
    float l[6];
    logits_of(p, 6, l);
    sampler_opts o = plain(1.0f);
    o.min_p = 0.05f;  /* cut below 0.05 * 0.40 = 0.02: token 2 goes, token 3 stays */
    sampler *sm = open_s(o, 6);
    int hits[6] = { 0 };
    for (int t = 0; t < 20000; t++) hits[sampler_sample(sm, l)]++;
    CHECK_EQ_INT(hits[2], 0);
    CHECK(hits[3] > 0 && hits[5] > 0);
    sampler_close(sm);
}

TEST(draws_follow_softmax)
{
    const double p[3] = { 0.2, 0.5, 0.3 };
    float l[3];
    logits_of(p, 3, l);
    sampler *sm = open_s(plain(1.0f), 3);
    int hits[3] = { 0 };
    const int N = 20000;
    for (int t = 0; t < N; t++) hits[sampler_sample(sm, l)]++;
    for (int i = 0; i < 3; i++) CHECK_NEAR(hits[i] / (double)N, p[i], 0.015);
    sampler_close(sm);
    /* temperature 0.5 squares the odds: p ~ p^2 */
    sm = open_s(plain(0.5f), 3);
    memset(hits, 0, sizeof hits);
    for (int t = 0; t < N; t++) hits[sampler_sample(sm, l)]++;
    const double z = 0.04 + 0.25 + 0.09;
    for (int i = 0; i < 3; i++) CHECK_NEAR(hits[i] / (double)N, p[i] * p[i] / z, 0.015);
    sampler_close(sm);
}

TEST(repeat_penalty_signs_and_window)
{
    sampler_opts o = plain(0.0f);
    o.repeat_penalty = 2.0f;
    o.repeat_last_n = 3;
    sampler *sm = open_s(o, 6);
    /* positive logit divided: 2.0 -> 1.0 loses to 1.9 */
    float a[6] = { 2.0f, -3.0f, 1.9f, -3.0f, -3.0f, -3.0f };
    CHECK_EQ_INT(sampler_sample(sm, a), 0);
    sampler_accept(sm, 0);
    CHECK_EQ_INT(sampler_sample(sm, a), 2);
    /* negative logit multiplied: -1.0 -> -2.0 loses to -1.5 */
    float b[6] = { -9.0f, -1.0f, -9.0f, -1.5f, -9.0f, -9.0f };
    sampler_accept(sm, 1);
    CHECK_EQ_INT(sampler_sample(sm, b), 3);
    /* the window holds the last 3 accepted tokens: after three others,
     * token 0 is no longer penalised */
    sampler_accept(sm, 5);
    sampler_accept(sm, 5);
    sampler_accept(sm, 4);
    CHECK_EQ_INT(sampler_sample(sm, a), 0);
    CHECK_EQ_INT(sampler_sample(sm, b), 1);
    sampler_close(sm);
    /* penalty 1.0 is off */
    o.repeat_penalty = 1.0f;
    sm = open_s(o, 6);
    sampler_accept(sm, 0);
    CHECK_EQ_INT(sampler_sample(sm, a), 0);
    sampler_close(sm);
}

TEST(bad_options)
{
    sampler *sm = NULL;
    err e;
    err_clear(&e);
    sampler_opts o = sampler_default_opts();
    CHECK(sampler_open(&sm, &o, 0, &e) != 0);
    o.repeat_last_n = -1;
    err_clear(&e);
    CHECK(sampler_open(&sm, &o, 10, &e) != 0);
    CHECK(sm == NULL);
    sampler_close(NULL);
}

int main(void)
{
    RUN(mt19937_reference_values);
    RUN(greedy_argmax_first_max_wins);
    RUN(top_k_one_is_argmax);
    RUN(seed_determinism);
    RUN(top_p_keeps_the_mass);
    RUN(min_p_cuts_relative_to_max);
    RUN(draws_follow_softmax);
    RUN(repeat_penalty_signs_and_window);
    RUN(bad_options);
    return test_summary("sampler");
}
