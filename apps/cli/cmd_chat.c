/* cmd_chat: `strata chat -m MODEL [--chat-template NAME] [-sys TEXT] [-n N]
 * [sampling flags]`. Options, model loading and the sampler are shared with
 * `strata run` (gen_main in cmd_run.c); this file is the conversation loop.
 *
 * One line of stdin is one user turn; EOF (or a read error) ends the chat.
 * Works the same with a terminal or a pipe; with a terminal a "> " prompt is
 * written to stderr. The reply is streamed to stdout and ended with a
 * newline.
 *
 * KV reuse: each turn formats the WHOLE conversation with the chat template
 * (plus the assistant opening), tokenizes it, and keeps the longest prefix
 * it shares with the tokens already in the session's cache; only the rest is
 * evaluated. The cached tokens include the reply as generated, so when the
 * template renders an earlier turn differently (a re-tokenized reply, a
 * stripped thinking block), the cache is cut back to where they diverge and
 * everything after is evaluated again: the result is always what a fresh
 * evaluation of the formatted text would give. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "engine.h"
#include "util/err.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}


typedef struct conv {
    engine_chat_msg *msgs;   /* roles are literals; contents are owned */
    size_t n, cap;
} conv;

static int conv_add(conv *c, const char *role, const char *content, size_t len)
{
    if (c->n == c->cap) {
        size_t nc = c->cap ? 2 * c->cap : 16;
        engine_chat_msg *m = realloc(c->msgs, nc * sizeof *m);
        if (!m) return -1;
        c->msgs = m;
        c->cap = nc;
    }
    char *t = malloc(len + 1);
    if (!t) return -1;
    memcpy(t, content, len);
    t[len] = '\0';
    c->msgs[c->n++] = (engine_chat_msg){ role, t };
    return 0;
}

static void conv_free(conv *c)
{
    for (size_t i = 0; i < c->n; i++) free((char *)c->msgs[i].content);
    free(c->msgs);
}

/* A growable byte buffer for the reply. */
typedef struct sbuf { char *p; size_t n, cap; } sbuf;

static int sbuf_add(sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *p = realloc(b->p, nc);
        if (!p) return -1;
        b->p = p;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

int chat_loop(engine *eng, session *s, sampler *sm, const char *tmpl_name, const char *system_prompt,
              int n_predict)
{
    const char *cmd = "chat";
    const int n_ctx = engine_n_ctx(eng);
    const int32_t V = engine_n_vocab(eng);
    const int tty = isatty(0);
    err e;
    err_clear(&e);
    int rc = CLI_ERR;
    conv c = { 0 };
    sbuf reply = { 0 };
    char *line = NULL, *text = NULL;
    size_t line_cap = 0, text_cap = 0;
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t *hist = malloc(sizeof(int32_t) * (size_t)n_ctx);   /* tokens in the cache */
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_ctx);
    int n_hist = 0, turn = 0;
    if (!logits || !hist || !ids) { cli_fail(cmd, CLI_ERR, "out of memory"); goto done; }
    if (system_prompt && conv_add(&c, "system", system_prompt, strlen(system_prompt))) {
        cli_fail(cmd, CLI_ERR, "out of memory");
        goto done;
    }
    /* Fail early (before the first read) when there is no usable template. */
    if (engine_chat_apply(eng, tmpl_name, c.msgs, c.n, 1, NULL, 0, &e) < 0) {
        cli_fail(cmd, CLI_ERR, "%s", e.msg);
        goto done;
    }

    for (;;) {
        if (tty) { fputs("> ", stderr); fflush(stderr); }
        ssize_t got = getline(&line, &line_cap, stdin);
        if (got < 0) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = '\0';
        if (got == 0) continue;
        if (conv_add(&c, "user", line, (size_t)got)) { cli_fail(cmd, CLI_ERR, "out of memory"); goto done; }

        /* format the whole conversation and tokenize it */
        int need = engine_chat_apply(eng, tmpl_name, c.msgs, c.n, 1, NULL, 0, &e);
        if (need < 0) { cli_fail(cmd, CLI_ERR, "%s", e.msg); goto done; }
        if ((size_t)need + 1 > text_cap) {
            char *t = realloc(text, (size_t)need + 1);
            if (!t) { cli_fail(cmd, CLI_ERR, "out of memory"); goto done; }
            text = t;
            text_cap = (size_t)need + 1;
        }
        if (engine_chat_apply(eng, tmpl_name, c.msgs, c.n, 1, text, text_cap, &e) < 0) {
            cli_fail(cmd, CLI_ERR, "%s", e.msg);
            goto done;
        }
        size_t n_ids = 0;
        int trc = engine_tokenize(eng, text, (size_t)need, engine_add_bos(eng), 1, ids, (size_t)n_ctx, &n_ids, &e);
        if (trc == ERR_RANGE || (trc == 0 && (long)n_ids > n_ctx - 4)) {
            cli_fail(cmd, CLI_ERR, "context full: the conversation needs %zu tokens, the context holds %d",
                     n_ids, n_ctx);
            goto done;
        }
        if (trc) { cli_fail(cmd, CLI_ERR, "tokenizing the conversation: %s", e.msg); goto done; }

        /* keep the cached prefix; evaluate the rest (at least one token, for logits) */
        int p = 0;
        while (p < n_hist && p < (int)n_ids && hist[p] == ids[p]) p++;
        if (p == (int)n_ids) p--;
        const int reused = p;
        session_truncate(s, p);
        for (size_t i = (size_t)p; i < n_ids; i++) sampler_accept(sm, ids[i]);
        if (session_eval(s, ids + p, (int)n_ids - p, logits, NULL, &e) != 0) {
            cli_fail(cmd, CLI_ERR, "%s", e.msg);
            goto done;
        }
        memcpy(hist + p, ids + p, sizeof(int32_t) * (n_ids - (size_t)p));
        n_hist = (int)n_ids;

        /* the reply */
        reply.n = 0;
        if (sbuf_add(&reply, "", 0)) { cli_fail(cmd, CLI_ERR, "out of memory"); goto done; }
        int n_gen = 0, ctx_full = 0;
        char piece[256];
        const double t0 = now_ms();
        while (n_predict < 0 || n_gen < n_predict) {
            int32_t id = sampler_sample(sm, logits);
            sampler_accept(sm, id);
            if (engine_token_is_eog(eng, id)) break;
            int np = engine_token_piece(eng, id, 0, piece, sizeof piece);
            if (np > (int)sizeof piece) np = (int)sizeof piece;
            if (np > 0) {
                fwrite(piece, 1, (size_t)np, stdout);
                if (sbuf_add(&reply, piece, (size_t)np)) { cli_fail(cmd, CLI_ERR, "out of memory"); goto done; }
            }
            fflush(stdout);
            n_gen++;
            if (n_predict >= 0 && n_gen >= n_predict) break;
            if (session_n_past(s) + 1 >= n_ctx) { ctx_full = 1; break; }
            if (session_eval(s, &id, 1, logits, NULL, &e) != 0) { cli_fail(cmd, CLI_ERR, "%s", e.msg); goto done; }
            hist[n_hist++] = id;
        }
        fputc('\n', stdout);
        fflush(stdout);
        const double t1 = now_ms();
        turn++;
        fprintf(stderr, "strata chat: turn %d: %d prompt tokens (%d reused from the cache, %d evaluated), "
                "reply %d tokens (%.2f tok/s)\n", turn, (int)n_ids, reused, (int)n_ids - reused, n_gen,
                t1 > t0 ? 1e3 * n_gen / (t1 - t0) : 0.0);
        if (conv_add(&c, "assistant", reply.p, reply.n)) { cli_fail(cmd, CLI_ERR, "out of memory"); goto done; }
        if (ctx_full) {
            cli_fail(cmd, CLI_ERR, "context full (%d tokens)", n_ctx);
            goto done;
        }
    }
    rc = CLI_OK;
done:
    conv_free(&c);
    free(reply.p);
    free(line);
    free(text);
    free(logits);
    free(hist);
    free(ids);
    return rc;
}

int cmd_chat(int argc, char **argv)
{
    return gen_main("chat", argc, argv);
}
