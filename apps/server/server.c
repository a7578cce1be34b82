/* server: `strata serve -m MODEL [...]`, an OpenAI-compatible HTTP server.
 *
 * Threads. libmicrohttpd runs one thread per connection (so a handler may
 * block while its request waits or generates, and a slow client stalls only
 * its own thread). The worker thread owns the engine's one session and
 * therefore all live KV cache state: requests reach it through a bounded
 * FIFO (full: 503 with Retry-After) and are served one at a time. The main
 * thread loads the model (the HTTP server is already up: /health answers
 * 503 "Loading model" until it is ready), then waits for SIGINT/SIGTERM.
 *
 * A job is shared by its connection and the worker (refcounted under the
 * one mutex). The connection polls its socket while it waits: a client that
 * goes away sets job->cancel, and the worker stops at the next token (or
 * prompt chunk). Streaming responses are fed from job->out by a content
 * reader callback.
 *
 * KV reuse (llama-server's cache_prompt): the worker keeps the tokens in the
 * cache; a new prompt keeps the longest common prefix and evaluates only the
 * rest, in n_batch chunks, which is exactly what a fresh evaluation of the
 * same tokens computes chunk by chunk.
 *
 * Shutdown: stop accepting (quiesce), answer queued requests 503, let the
 * running one finish, stop the daemon, exit 0. */
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <microhttpd.h>

#include "cli.h"
#include "engine.h"
#include "server.h"

#define CMD "serve"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ==== options ==== */
typedef struct srv_opts {
    const char *model, *host, *api_key, *alias, *chat_template, *debug_reply;
    int debug_delay_ms;
    int port, n_ctx, n_batch, n_threads, n_predict, queue, timeout_s, idle_s, kv_k, kv_v;
    uint64_t max_body;
    engine_opts st;            /* the expert-streaming flags (cli_stream_flag) */
} srv_opts;

/* ==== jobs ==== */
enum { JOB_QUEUED = 0, JOB_RUNNING = 1, JOB_DONE = 2 };

typedef struct job {
    srv_req req;
    int refs;
    int state;
    int status;            /* final HTTP status (DONE before RUNNING: an error) */
    char *body;            /* non-streaming response or error JSON */
    char *out;             /* streaming: SSE bytes produced ... */
    size_t out_n, out_cap, out_off;   /* ... and consumed */
    atomic_int cancel;
    int fd;                /* the client's socket, to notice it going away */
    double deadline_ms;
    struct job *next;
} job;

/* ==== the server ==== */
typedef struct srv {
    srv_opts o;
    engine *eng;
    session *s;
    char model_id[256];
    atomic_int ready, stopping;
    atomic_int active;     /* requests between their headers and their last byte sent */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_job;
    job *head, *tail;
    int n_queued, running;
    int32_t *hist;         /* tokens in the session's cache (worker only) */
    int32_t *eog;          /* end-of-generation token ids (ignore_eos) */
    int n_eog;
    int n_hist;
    /* metrics (under mu) */
    uint64_t by_status[600];
    uint64_t prompt_tokens, prompt_cached, gen_tokens, n_requests_done;
    double prompt_ms, gen_ms;
    int have_stream;
    engine_stream_counters sc[2];
    int          arena_slots, arena_filled;  /* occupancy after the last request */
    engine_memory mem;
} srv;

static void job_unref(srv *S, job *j)   /* under S->mu */
{
    (void)S;
    if (--j->refs > 0) return;
    srv_req_free(&j->req);
    free(j->body);
    free(j->out);
    free(j);
}

/* Append streamed bytes (under mu). Returns -1 on OOM. */
static int job_emit(job *j, const char *s, size_t n)
{
    if (j->out_n + n > j->out_cap) {
        size_t nc = j->out_cap ? j->out_cap : 4096;
        while (nc < j->out_n + n) nc *= 2;
        char *p = realloc(j->out, nc);
        if (!p) return -1;
        j->out = p;
        j->out_cap = nc;
    }
    memcpy(j->out + j->out_n, s, n);
    j->out_n += n;
    return 0;
}

/* 1 when the peer closed its end (or reset). */
static int peer_gone(int fd)
{
    if (fd < 0) return 0;
    struct pollfd p = { .fd = fd, .events = POLLIN | POLLRDHUP };
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return 1;
    char c;
    ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

/* ==== the worker ==== */

static void job_finish(srv *S, job *j, int status, char *body)   /* under mu */
{
    j->status = status;
    free(j->body);
    j->body = body;
    j->state = JOB_DONE;
    pthread_cond_broadcast(&S->cv_job);
}

/* An error before the headers went out is the response; after (a stream
 * already answered 200) it becomes a last `data: {"error": ...}` event. */
static void job_error(srv *S, job *j, int status, const char *msg)
{
    pthread_mutex_lock(&S->mu);
    if (j->state == JOB_RUNNING && j->req.stream) {
        char *b = srv_error_json(status, msg);
        if (b) {
            job_emit(j, "data: ", 6);
            job_emit(j, b, strlen(b));
            job_emit(j, "\n\n", 2);
            free(b);
        }
        job_finish(S, j, 200, NULL);
        pthread_mutex_unlock(&S->mu);
        return;
    }
    job_finish(S, j, status, srv_error_json(status, msg));
    pthread_mutex_unlock(&S->mu);
}

/* Length of the longest suffix of text[0..n) that is a proper prefix of a stop string. */
static size_t stop_partial(const srv_req *r, const char *text, size_t n)
{
    size_t best = 0;
    for (int i = 0; i < r->n_stop; i++) {
        size_t sl = strlen(r->stop[i]);
        for (size_t k = sl - 1; k > best; k--)
            if (k <= n && !memcmp(text + n - k, r->stop[i], k)) { best = k; break; }
    }
    return best;
}

/* Bytes at the end of text[0..n) that are an unfinished UTF-8 character. */
static size_t utf8_partial(const char *text, size_t n)
{
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned char c = (unsigned char)text[n - back];
        if ((c & 0xC0) == 0x80) continue;          /* continuation byte */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

static void run_job(srv *S, job *j)
{
    engine *eng = S->eng;
    session *s = S->s;
    srv_req *rq = &j->req;
    const int n_ctx = engine_n_ctx(eng), n_batch = engine_n_batch(eng);
    const int32_t V = engine_n_vocab(eng);
    err e;
    err_clear(&e);
    char *text = NULL, *gen = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    sampler *sm = NULL;
    size_t gen_n = 0, gen_cap = 0, sent = 0;
    char idbuf[64];
    snprintf(idbuf, sizeof idbuf, "%s-%08x%08x", rq->kind == SRV_CHAT ? "chatcmpl" : "cmpl", (unsigned)rand(),
             (unsigned)rand());
    srv_result res = { .id = idbuf, .model = S->model_id, .created = (long long)time(NULL), .finish = "stop" };

    /* the prompt text */
    if (rq->kind == SRV_CHAT) {
        int need = engine_chat_apply(eng, S->o.chat_template, rq->msgs, rq->n_msgs, 1, NULL, 0, &e);
        if (need < 0) { job_error(S, j, 500, e.msg); goto done; }
        if (!(text = malloc((size_t)need + 1))) { job_error(S, j, 500, "out of memory"); goto done; }
        if (engine_chat_apply(eng, S->o.chat_template, rq->msgs, rq->n_msgs, 1, text, (size_t)need + 1, &e) < 0) {
            job_error(S, j, 500, e.msg);
            goto done;
        }
    } else {
        text = rq->prompt;
        rq->prompt = NULL;
    }
    size_t len = strlen(text), n_ids = 0;
    size_t cap = len + 8;
    ids = malloc(sizeof(int32_t) * cap);
    logits = malloc(sizeof(float) * (size_t)V);
    if (!ids || !logits) { job_error(S, j, 500, "out of memory"); goto done; }
    if (engine_tokenize(eng, text, len, engine_add_bos(eng), 1, ids, cap, &n_ids, &e) != 0) {
        job_error(S, j, 400, e.msg);
        goto done;
    }
    if (n_ids == 0) {
        if (engine_token_bos(eng) < 0) { job_error(S, j, 400, "the prompt is empty"); goto done; }
        ids[n_ids++] = engine_token_bos(eng);
    }
    if ((long)n_ids > n_ctx - 4) {
        char m[160];
        snprintf(m, sizeof m, "the request exceeds the available context size (%zu prompt tokens, context %d)", n_ids,
                 n_ctx);
        job_error(S, j, 400, m);
        goto done;
    }

    /* keep the cached prefix; evaluate the rest (at least one token, for logits) */
    int p = 0;
    while (p < S->n_hist && p < (int)n_ids && S->hist[p] == ids[p]) p++;
    if (p == (int)n_ids) p--;
    session_truncate(s, p);
    S->n_hist = p;
    res.cached_tokens = p;
    res.prompt_tokens = (int)n_ids;
    const double t0 = now_ms();
    for (int at = p; at < (int)n_ids;) {
        if (atomic_load(&j->cancel) || now_ms() > j->deadline_ms) {
            job_error(S, j, 503, "request cancelled or timed out while evaluating the prompt");
            goto done;
        }
        int n = (int)n_ids - at < n_batch ? (int)n_ids - at : n_batch;
        if (session_eval(s, ids + at, n, logits, NULL, &e) != 0) { job_error(S, j, 500, e.msg); goto done; }
        memcpy(S->hist + at, ids + at, sizeof(int32_t) * (size_t)n);
        at += n;
        S->n_hist = at;
    }
    const double t1 = now_ms();
    res.prompt_ms = t1 - t0;

    sampler_opts so = rq->so;
    if (!rq->seed_set) so.seed = (uint32_t)rand() ^ (uint32_t)time(NULL);
    if (sampler_open(&sm, &so, V, &e) != 0) { job_error(S, j, 500, e.msg); goto done; }
    for (size_t i = 0; i < n_ids; i++) sampler_accept(sm, ids[i]);

    /* headers can go now */
    pthread_mutex_lock(&S->mu);
    j->state = JOB_RUNNING;
    if (rq->stream && rq->kind == SRV_CHAT) {
        char *c = srv_sse_chunk(rq, &res, NULL, 0, 1, NULL, NULL, 0);
        if (c) { job_emit(j, c, strlen(c)); free(c); }
    }
    pthread_cond_broadcast(&S->cv_job);
    pthread_mutex_unlock(&S->mu);

    int n_gen = 0, stopped = 0;
    const int max_tokens = rq->max_tokens >= 0 ? rq->max_tokens : S->o.n_predict;
    char piece[256];
    const int stream_text = rq->stream && !(rq->kind == SRV_CHAT && rq->tools);
    if (S->o.debug_reply) {
        /* testing only: the reply is fixed; count its tokens as generated */
        gen_n = strlen(S->o.debug_reply);
        gen = strdup(S->o.debug_reply);
        size_t nt = 0;
        int32_t *tmp = malloc(sizeof(int32_t) * (gen_n + 8));
        if (tmp && engine_tokenize(eng, gen, gen_n, 0, 1, tmp, gen_n + 8, &nt, &e) == 0) n_gen = (int)nt;
        free(tmp);
        if (!gen) gen_n = 0;
    }
    while (!S->o.debug_reply && (max_tokens < 0 || n_gen < max_tokens)) {
        if (atomic_load(&j->cancel)) break;
        if (now_ms() > j->deadline_ms) { res.finish = "length"; break; }
        if (rq->ignore_eos) for (int k = 0; k < S->n_eog; k++) logits[S->eog[k]] = -INFINITY;
        int32_t id = sampler_sample(sm, logits);
        sampler_accept(sm, id);
        if (engine_token_is_eog(eng, id)) break;
        int np = engine_token_piece(eng, id, 0, piece, sizeof piece);
        if (np > (int)sizeof piece) np = (int)sizeof piece;
        if (np < 0) np = 0;
        if (gen_n + (size_t)np + 1 > gen_cap) {
            size_t nc = gen_cap ? 2 * gen_cap : 1024;
            while (nc < gen_n + (size_t)np + 1) nc *= 2;
            char *g = realloc(gen, nc);
            if (!g) { job_error(S, j, 500, "out of memory"); goto done; }
            gen = g;
            gen_cap = nc;
        }
        memcpy(gen + gen_n, piece, (size_t)np);
        gen_n += (size_t)np;
        gen[gen_n] = '\0';
        n_gen++;
        /* stop strings: look in the tail the new piece can complete */
        size_t maxs = 0;
        for (int i = 0; i < rq->n_stop; i++) if (strlen(rq->stop[i]) > maxs) maxs = strlen(rq->stop[i]);
        if (rq->n_stop) {
            size_t from = gen_n > (size_t)np + maxs ? gen_n - (size_t)np - maxs : 0;
            size_t cut = gen_n + 1;
            for (int i = 0; i < rq->n_stop; i++) {
                char *hit = memmem(gen + from, gen_n - from, rq->stop[i], strlen(rq->stop[i]));
                if (hit && (size_t)(hit - gen) < cut) cut = (size_t)(hit - gen);
            }
            if (cut <= gen_n) { gen_n = cut; gen[gen_n] = '\0'; stopped = 1; }
        }
        if (stream_text && !stopped) {
            size_t hold = stop_partial(rq, gen, gen_n);
            size_t u = utf8_partial(gen, gen_n - hold);
            size_t upto = gen_n - hold - u;
            if (upto > sent) {
                char *c = srv_sse_chunk(rq, &res, gen + sent, upto - sent, 0, NULL, NULL, 0);
                pthread_mutex_lock(&S->mu);
                if (c) job_emit(j, c, strlen(c));
                pthread_cond_broadcast(&S->cv_job);
                pthread_mutex_unlock(&S->mu);
                free(c);
                sent = upto;
            }
        }
        if (stopped) break;
        if (max_tokens >= 0 && n_gen >= max_tokens) { res.finish = "length"; break; }
        if (session_n_past(s) + 1 >= n_ctx) { res.finish = "length"; break; }
        if (session_eval(s, &id, 1, logits, NULL, &e) != 0) { job_error(S, j, 500, e.msg); goto done; }
        S->hist[S->n_hist++] = id;
        if (S->o.debug_delay_ms) usleep((useconds_t)S->o.debug_delay_ms * 1000);
    }
    const double t2 = now_ms();
    res.gen_ms = t2 - t1;
    res.text = gen ? gen : "";
    res.len = gen_n;
    res.completion_tokens = n_gen;

    pthread_mutex_lock(&S->mu);
    if (rq->stream) {
        if (stream_text && gen_n > sent) {
            char *c = srv_sse_chunk(rq, &res, gen + sent, gen_n - sent, 0, NULL, NULL, 0);
            if (c) { job_emit(j, c, strlen(c)); free(c); }
        }
        char *c = srv_sse_chunk(rq, &res, NULL, 0, 0, res.finish, res.text, res.len);
        if (c) { job_emit(j, c, strlen(c)); free(c); }
        if (rq->include_usage && (c = srv_sse_usage(rq, &res))) { job_emit(j, c, strlen(c)); free(c); }
        job_emit(j, "data: [DONE]\n\n", 14);
        job_finish(S, j, 200, NULL);
    } else {
        char *b = srv_build_response(rq, &res);
        job_finish(S, j, b ? 200 : 500, b ? b : srv_error_json(500, "out of memory"));
    }
    S->prompt_tokens += (uint64_t)(res.prompt_tokens - res.cached_tokens);
    S->prompt_cached += (uint64_t)res.cached_tokens;
    S->gen_tokens += (uint64_t)n_gen;
    S->prompt_ms += res.prompt_ms;
    S->gen_ms += res.gen_ms;
    S->n_requests_done++;
    pthread_mutex_unlock(&S->mu);
done:
    sampler_close(sm);
    free(text);
    free(gen);
    free(ids);
    free(logits);
}

static void *worker_main(void *arg)
{
    srv *S = arg;
    pthread_mutex_lock(&S->mu);
    for (;;) {
        while (!S->head && !atomic_load(&S->stopping)) pthread_cond_wait(&S->cv_work, &S->mu);
        if (!S->head) break;
        job *j = S->head;
        S->head = j->next;
        if (!S->head) S->tail = NULL;
        S->n_queued--;
        if (atomic_load(&j->cancel) || now_ms() > j->deadline_ms) {
            job_finish(S, j, 503, srv_error_json(503, "request cancelled or timed out in the queue"));
            job_unref(S, j);
            continue;
        }
        S->running = 1;
        pthread_mutex_unlock(&S->mu);
        run_job(S, j);
        pthread_mutex_lock(&S->mu);
        if (S->have_stream) {
            engine_stream_counters_get(S->eng, ENGINE_PHASE_PROMPT, &S->sc[0]);
            engine_stream_counters_get(S->eng, ENGINE_PHASE_DECODE, &S->sc[1]);
            engine_stream_occupancy(S->eng, &S->arena_slots, &S->arena_filled);
        }
        S->running = 0;
        job_unref(S, j);
    }
    pthread_mutex_unlock(&S->mu);
    return NULL;
}

/* ==== HTTP ==== */

typedef struct conn_ctx {
    char *body;
    size_t n, cap;
    int too_large;
    job *j;                /* a streaming job the response still reads */
} conn_ctx;

static enum MHD_Result reply(srv *S, struct MHD_Connection *c, int status, char *body, const char *ctype)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(body ? strlen(body) : 0, body ? body : (char *)"",
                                                             body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) { free(body); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", ctype);
    if (status == 503) MHD_add_response_header(r, "Retry-After", "1");
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (status == 405) MHD_add_response_header(r, "Allow", "GET, POST");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    pthread_mutex_lock(&S->mu);
    if (status >= 100 && status < 600) S->by_status[status]++;
    pthread_mutex_unlock(&S->mu);
    return ret;
}

static enum MHD_Result reply_err(srv *S, struct MHD_Connection *c, int status, const char *msg)
{
    return reply(S, c, status, srv_error_json(status, msg), "application/json");
}

typedef struct stream_ctx { srv *S; job *j; } stream_ctx;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    stream_ctx *sc = cls;
    srv *S = sc->S;
    job *j = sc->j;
    pthread_mutex_lock(&S->mu);
    for (;;) {
        if (j->out_n > j->out_off) {
            size_t n = j->out_n - j->out_off;
            if (n > max) n = max;
            memcpy(buf, j->out + j->out_off, n);
            j->out_off += n;
            pthread_mutex_unlock(&S->mu);
            return (ssize_t)n;
        }
        if (j->state == JOB_DONE) { pthread_mutex_unlock(&S->mu); return MHD_CONTENT_READER_END_OF_STREAM; }
        timed_wait(&S->cv_job, &S->mu, 100);
        if (peer_gone(j->fd)) {
            atomic_store(&j->cancel, 1);
            pthread_mutex_unlock(&S->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls)
{
    stream_ctx *sc = cls;
    pthread_mutex_lock(&sc->S->mu);
    atomic_store(&sc->j->cancel, 1);
    job_unref(sc->S, sc->j);
    pthread_mutex_unlock(&sc->S->mu);
    free(sc);
}

static int authorized(srv *S, struct MHD_Connection *c)
{
    if (!S->o.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return 0;
    h += 7;
    /* compare without an early exit */
    size_t a = strlen(h), b = strlen(S->o.api_key);
    unsigned diff = (unsigned)(a != b);
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned char)(h[i] ^ S->o.api_key[i]);
    return diff == 0;
}

static char *metrics_text(srv *S)
{
    size_t cap = 16384;
    char *b = malloc(cap);
    if (!b) return NULL;
    size_t n = 0;
#define P(...) do { int w_ = snprintf(b + n, cap - n, __VA_ARGS__); if (w_ > 0) n += (size_t)w_ < cap - n ? (size_t)w_ : cap - n - 1; } while (0)
    pthread_mutex_lock(&S->mu);
    P("# HELP strata_requests_total HTTP responses sent, by status.\n# TYPE strata_requests_total counter\n");
    for (int st = 100; st < 600; st++)
        if (S->by_status[st]) P("strata_requests_total{status=\"%d\"} %llu\n", st, (unsigned long long)S->by_status[st]);
    P("# HELP strata_prompt_tokens_total Prompt tokens evaluated (not counting reused cache).\n"
      "# TYPE strata_prompt_tokens_total counter\nstrata_prompt_tokens_total %llu\n",
      (unsigned long long)S->prompt_tokens);
    P("# HELP strata_prompt_tokens_cached_total Prompt tokens reused from the KV cache.\n"
      "# TYPE strata_prompt_tokens_cached_total counter\nstrata_prompt_tokens_cached_total %llu\n",
      (unsigned long long)S->prompt_cached);
    P("# HELP strata_tokens_predicted_total Generated tokens.\n# TYPE strata_tokens_predicted_total counter\n"
      "strata_tokens_predicted_total %llu\n", (unsigned long long)S->gen_tokens);
    P("# HELP strata_prompt_seconds_total Time spent evaluating prompts.\n# TYPE strata_prompt_seconds_total counter\n"
      "strata_prompt_seconds_total %.6f\n", S->prompt_ms / 1e3);
    P("# HELP strata_tokens_predicted_seconds_total Time spent generating.\n"
      "# TYPE strata_tokens_predicted_seconds_total counter\nstrata_tokens_predicted_seconds_total %.6f\n",
      S->gen_ms / 1e3);
    P("# HELP strata_prompt_tokens_seconds Average prompt throughput (tokens/s).\n"
      "# TYPE strata_prompt_tokens_seconds gauge\nstrata_prompt_tokens_seconds %.4f\n",
      S->prompt_ms > 0 ? 1e3 * (double)S->prompt_tokens / S->prompt_ms : 0.0);
    P("# HELP strata_predicted_tokens_seconds Average generation throughput (tokens/s).\n"
      "# TYPE strata_predicted_tokens_seconds gauge\nstrata_predicted_tokens_seconds %.4f\n",
      S->gen_ms > 0 ? 1e3 * (double)S->gen_tokens / S->gen_ms : 0.0);
    P("# HELP strata_requests_processing Requests being generated.\n# TYPE strata_requests_processing gauge\n"
      "strata_requests_processing %d\n", S->running);
    P("# HELP strata_requests_deferred Requests waiting in the queue.\n# TYPE strata_requests_deferred gauge\n"
      "strata_requests_deferred %d\n", S->n_queued);
    P("# HELP strata_memory_bytes Planned memory by part.\n# TYPE strata_memory_bytes gauge\n"
      "strata_memory_bytes{part=\"weights\"} %llu\nstrata_memory_bytes{part=\"arena\"} %llu\n"
      "strata_memory_bytes{part=\"kv\"} %llu\nstrata_memory_bytes{part=\"scratch\"} %llu\n",
      (unsigned long long)S->mem.weights, (unsigned long long)S->mem.arena, (unsigned long long)S->mem.kv,
      (unsigned long long)S->mem.scratch);
    P("# HELP strata_expert_stream_streaming 1 when routed experts stream from disk.\n"
      "# TYPE strata_expert_stream_streaming gauge\nstrata_expert_stream_streaming %d\n", S->have_stream);
    if (S->have_stream) {
        static const char *ph[2] = { "prompt", "decode" };
        const struct { const char *name, *help; size_t off; } f[] = {
            { "lookups", "Distinct layer-experts wanted per chunk, summed.", offsetof(engine_stream_counters, lookups) },
            { "hits", "Expert lookups found in the arena.", offsetof(engine_stream_counters, hits) },
            { "ahead", "Expert lookups served by a read-ahead prefetch.", offsetof(engine_stream_counters, ahead) },
            { "misses", "Expert lookups read on demand.", offsetof(engine_stream_counters, misses) },
            { "streamed_in", "Experts read into arena slots.", offsetof(engine_stream_counters, streamed_in) },
            { "prefetch_wasted", "Prefetched experts dropped unused.", offsetof(engine_stream_counters, prefetch_wasted) },
            { "bytes_read", "Bytes read from the model file.", offsetof(engine_stream_counters, bytes) },
            { "io_errors", "Expert read errors.", offsetof(engine_stream_counters, io_errors) },
        };
        for (size_t k = 0; k < sizeof f / sizeof f[0]; k++) {
            P("# HELP strata_expert_stream_%s_total %s\n# TYPE strata_expert_stream_%s_total counter\n", f[k].name,
              f[k].help, f[k].name);
            for (int p = 0; p < 2; p++)
                P("strata_expert_stream_%s_total{phase=\"%s\"} %llu\n", f[k].name, ph[p],
                  (unsigned long long)*(const uint64_t *)((const char *)&S->sc[p] + f[k].off));
        }
        P("# HELP strata_expert_arena_slots Slots in the expert arena.\n"
          "# TYPE strata_expert_arena_slots gauge\nstrata_expert_arena_slots %d\n"
          "# HELP strata_expert_arena_filled_slots Arena slots holding a resident expert (after the last request).\n"
          "# TYPE strata_expert_arena_filled_slots gauge\nstrata_expert_arena_filled_slots %d\n",
          S->arena_slots, S->arena_filled);
    }
    pthread_mutex_unlock(&S->mu);
#undef P
    return b;
}

static enum MHD_Result handle_generate(srv *S, struct MHD_Connection *c, conn_ctx *cc, int kind)
{
    char msg[256];
    job *j = calloc(1, sizeof *j);
    if (!j) return reply_err(S, c, 500, "out of memory");
    int st = srv_req_parse(kind, cc->body ? cc->body : "", cc->n, &j->req, msg, sizeof msg);
    if (st) { srv_req_free(&j->req); free(j); return reply_err(S, c, st, msg); }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    j->deadline_ms = now_ms() + 1e3 * S->o.timeout_s;
    j->refs = 2;
    pthread_mutex_lock(&S->mu);
    /* --queue N: N may wait while one generates (0: only when idle) */
    if (atomic_load(&S->stopping) || S->n_queued + S->running > S->o.queue) {
        int stopping = atomic_load(&S->stopping);
        pthread_mutex_unlock(&S->mu);
        srv_req_free(&j->req);
        free(j);
        return reply_err(S, c, 503, stopping ? "the server is shutting down" : "the server is busy: the queue is full");
    }
    if (S->tail) S->tail->next = j; else S->head = j;
    S->tail = j;
    S->n_queued++;
    pthread_cond_signal(&S->cv_work);
    /* wait for the headers (streaming) or the whole answer */
    while (j->state == JOB_QUEUED || (j->state == JOB_RUNNING && !j->req.stream)) {
        timed_wait(&S->cv_job, &S->mu, 100);
        if (!atomic_load(&j->cancel) && peer_gone(j->fd)) atomic_store(&j->cancel, 1);
    }
    if (j->state == JOB_DONE && (j->status != 200 || !j->req.stream)) {
        int status = j->status;
        char *body = j->body;
        j->body = NULL;
        job_unref(S, j);
        pthread_mutex_unlock(&S->mu);
        return reply(S, c, status, body, "application/json");
    }
    pthread_mutex_unlock(&S->mu);
    stream_ctx *sc = malloc(sizeof *sc);
    struct MHD_Response *r = sc ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, sc, stream_free)
                                : NULL;
    if (!r) {
        free(sc);
        pthread_mutex_lock(&S->mu);
        atomic_store(&j->cancel, 1);
        job_unref(S, j);
        pthread_mutex_unlock(&S->mu);
        return reply_err(S, c, 500, "out of memory");
    }
    *sc = (stream_ctx){ S, j };
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    pthread_mutex_lock(&S->mu);
    S->by_status[200]++;
    pthread_mutex_unlock(&S->mu);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_n, void **con_cls)
{
    (void)version;
    srv *S = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) {
        if (!(cc = calloc(1, sizeof *cc))) return MHD_NO;
        *con_cls = cc;
        atomic_fetch_add(&S->active, 1);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > S->o.max_body) {
            cc->too_large = 1;
            return reply_err(S, c, 413, "the request body is too large");
        }
        return MHD_YES;
    }
    if (*upload_n) {
        if (!cc->too_large && cc->n + *upload_n > S->o.max_body) {
            cc->too_large = 1;
            free(cc->body);
            cc->body = NULL;
            cc->n = cc->cap = 0;
        }
        if (!cc->too_large) {
            if (cc->n + *upload_n + 1 > cc->cap) {
                size_t nc = cc->cap ? cc->cap : 4096;
                while (nc < cc->n + *upload_n + 1) nc *= 2;
                char *p = realloc(cc->body, nc);
                if (!p) return MHD_NO;
                cc->body = p;
                cc->cap = nc;
            }
            memcpy(cc->body + cc->n, upload, *upload_n);
            cc->n += *upload_n;
            cc->body[cc->n] = '\0';
        }
        *upload_n = 0;
        return MHD_YES;
    }
    if (cc->too_large) return reply_err(S, c, 413, "the request body is too large");

    const int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/health") || !strcmp(url, "/v1/health")) {
        if (!get) return reply_err(S, c, 405, "use GET");
        if (!atomic_load(&S->ready)) return reply_err(S, c, 503, "Loading model");
        return reply(S, c, 200, strdup("{\"status\":\"ok\"}"), "application/json");
    }
    int kind = -1, is_models = 0, is_metrics = 0;
    if (!strcmp(url, "/v1/chat/completions") || !strcmp(url, "/chat/completions")) kind = SRV_CHAT;
    else if (!strcmp(url, "/v1/completions") || !strcmp(url, "/completions")) kind = SRV_COMPLETION;
    else if (!strcmp(url, "/v1/models") || !strcmp(url, "/models")) is_models = 1;
    else if (!strcmp(url, "/metrics")) is_metrics = 1;
    else return reply_err(S, c, 404, "not found");
    if (kind >= 0 && !post) return reply_err(S, c, 405, "use POST");
    if (kind < 0 && !get) return reply_err(S, c, 405, "use GET");
    if (!authorized(S, c)) return reply_err(S, c, 401, "invalid API key");
    if (!atomic_load(&S->ready)) return reply_err(S, c, 503, "Loading model");
    if (is_metrics) {
        char *m = metrics_text(S);
        return m ? reply(S, c, 200, m, "text/plain; version=0.0.4") : reply_err(S, c, 500, "out of memory");
    }
    if (is_models) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "list");
        cJSON *d = cJSON_AddArrayToObject(o, "data");
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "id", S->model_id);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", (double)time(NULL));
        cJSON_AddStringToObject(m, "owned_by", "strata");
        cJSON *meta = cJSON_AddObjectToObject(m, "meta");
        cJSON_AddStringToObject(meta, "desc", engine_model_desc(S->eng));
        cJSON_AddNumberToObject(meta, "n_ctx", engine_n_ctx(S->eng));
        cJSON_AddNumberToObject(meta, "n_ctx_train", engine_n_ctx_train(S->eng));
        cJSON_AddNumberToObject(meta, "n_vocab", engine_n_vocab(S->eng));
        cJSON_AddNumberToObject(meta, "n_params", (double)engine_model_params(S->eng));
        cJSON_AddNumberToObject(meta, "size", (double)engine_model_bytes(S->eng));
        cJSON_AddItemToArray(d, m);
        char *s = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        return s ? reply(S, c, 200, s, "application/json") : reply_err(S, c, 500, "out of memory");
    }
    return handle_generate(S, c, cc, kind);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode tc)
{
    (void)c; (void)tc;
    srv *S = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    atomic_fetch_sub(&S->active, 1);
    free(cc->body);
    free(cc);
    *con_cls = NULL;
}

/* ==== options ==== */

static void usage(FILE *out)
{
    fprintf(out,
        "usage: strata serve -m MODEL [--host ADDR] [--port N] [--api-key KEY] [options]\n\n"
        "OpenAI-compatible HTTP server: POST /v1/chat/completions, POST /v1/completions,\n"
        "GET /v1/models, GET /health, GET /metrics (see docs/SERVER.md).\n\n"
        "  -m, --model FILE          GGUF model\n"
        "  --host ADDR               address to listen on (default 127.0.0.1)\n"
        "  --port N                  port (default 8080; 0: any free port, printed on stderr)\n"
        "  --api-key KEY             require 'Authorization: Bearer KEY' (not for /health)\n"
        "  --alias NAME              model id in the API (default: the file name)\n"
        "  --chat-template NAME      use a built-in chat template instead of the model's\n"
        "  -c, --ctx-size N          context size (default 4096 or the model's if smaller; 0: the model's)\n"
        "  -b, --batch-size N        prompt chunk, rows per forward pass (default 2048)\n"
        "  -t, --threads N           threads (default: all CPUs)\n"
        "  -n, --n-predict N         generated tokens when a request gives no max_tokens (default -1:\n"
        "                            until end of generation or the context is full)\n"
        "  --queue N                 requests that may wait for the model (default 8; more: 503)\n"
        "  --timeout S               per-request limit in seconds, queue wait included (default 600)\n"
        "  --idle-timeout S          close idle HTTP connections after S seconds (default 60)\n"
        "  --max-body SIZE           request body limit (K/M suffixes; default 8M; larger: 413)\n"
        "  -ctk, -ctv T              KV cache types f16 (default) or f32\n"
        "  --debug-reply TEXT        testing only: every reply is TEXT instead of generated tokens\n"
        "                            (the prompt is still evaluated); exercises tool-call parsing\n"
        "  --debug-token-delay MS    testing only: sleep MS per generated token (timeouts, cancel)\n"
        "  -h, --help                this help\n\n"
        "Expert streaming (as strata run): --arena SIZE|auto|0, --evict lru|lfu, --io auto|uring|pread,\n"
        "  --io-threads N, --io-depth N, --read-ahead N, --read-ahead-from attn|input, --no-direct,\n"
        "  --sidecar FILE, --no-sidecar, --profile FILE\n"
        "GPU (build/cuda/strata, as strata run): --gpu, -ngl N, --gpu-arena SIZE, --host-cache SIZE\n"
        "Routing: --route SPEC (docs/ROUTING.md; default exact, or STRATA_ROUTE)\n");
}

enum { HELP_SHOWN = 100 };

static int parse_args(int argc, char **argv, srv_opts *o)
{
    const char *cmd = CMD;
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->n_predict = -1;
    o->queue = 8;
    o->timeout_s = 600;
    o->idle_s = 60;
    o->max_body = 8u << 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        const char *v = NULL;
        long long n;
#define IS(s) (!strcmp(a, s))
#define VALUE() do { if (!(v = cli_value(cmd, argc, argv, &i))) return CLI_USAGE; } while (0)
#define INT(lo, hi, dst) do { VALUE(); if (cli_parse_int(v, lo, hi, &n)) \
        return cli_fail(cmd, CLI_USAGE, "%s needs a whole number from %lld to %lld, got '%s'", a, \
                        (long long)(lo), (long long)(hi), v); dst = (int)n; } while (0)
        if (IS("-h") || IS("--help")) { usage(stdout); return HELP_SHOWN; }
        else if (IS("-m") || IS("--model")) { VALUE(); o->model = v; }
        else if (IS("--host")) { VALUE(); o->host = v; }
        else if (IS("--port")) INT(0, 65535, o->port);
        else if (IS("--api-key")) { VALUE(); o->api_key = v; }
        else if (IS("--alias")) { VALUE(); o->alias = v; }
        else if (IS("--chat-template")) { VALUE(); o->chat_template = v; }
        else if (IS("--debug-reply")) { VALUE(); o->debug_reply = v; }
        else if (IS("--debug-token-delay")) INT(0, 10000, o->debug_delay_ms);
        else if (IS("-c") || IS("--ctx-size")) {
            INT(0, 1 << 24, o->n_ctx);
            if (o->n_ctx == 0) o->n_ctx = ENGINE_CTX_TRAIN;
        }
        else if (IS("-b") || IS("--batch-size") || IS("-ub") || IS("--ubatch-size")) INT(1, 1 << 20, o->n_batch);
        else if (IS("-t") || IS("--threads")) INT(1, 1024, o->n_threads);
        else if (IS("-n") || IS("--n-predict")) INT(-1, 1000000000, o->n_predict);
        else if (IS("--queue")) INT(0, 100000, o->queue);
        else if (IS("--timeout")) INT(1, 86400 * 7, o->timeout_s);
        else if (IS("--idle-timeout")) INT(1, 86400, o->idle_s);
        else if (IS("--max-body")) {
            VALUE();
            if (cli_parse_size(v, &o->max_body) || o->max_body == 0)
                return cli_fail(cmd, CLI_USAGE, "--max-body needs a size (K/M/G suffixes), got '%s'", v);
        }
        else if (IS("-ctk") || IS("--cache-type-k") || IS("-ctv") || IS("--cache-type-v")) {
            VALUE();
            int t = !strcmp(v, "f16") ? ENGINE_KV_F16 : !strcmp(v, "f32") ? ENGINE_KV_F32 : -1;
            if (t < 0) return cli_fail(cmd, CLI_USAGE, "%s must be f16 or f32, got '%s'", a, v);
            if (IS("-ctk") || IS("--cache-type-k")) o->kv_k = t; else o->kv_v = t;
        }
        else if ((r = cli_stream_flag(cmd, argc, argv, &i, &o->st)) != 0) {
            if (r < 0) return CLI_USAGE;
        }
        else return cli_fail(cmd, CLI_USAGE, "unknown option '%s' (see strata serve --help)", a);
#undef IS
#undef VALUE
#undef INT
    }
    if (!o->model) return cli_fail(cmd, CLI_USAGE, "no model given (-m MODEL)");
    if (cli_stream_check(cmd, &o->st)) return CLI_USAGE;
    return 0;
}

/* ==== main ==== */

int cmd_serve(int argc, char **argv)
{
    static srv S;   /* one server per process; MHD threads point at it */
    int rc = parse_args(argc, argv, &S.o);
    if (rc == HELP_SHOWN) return CLI_OK;
    if (rc) return rc;
    const srv_opts *o = &S.o;
    const char *base = strrchr(o->model, '/');
    snprintf(S.model_id, sizeof S.model_id, "%s", o->alias ? o->alias : base ? base + 1 : o->model);
    pthread_mutex_init(&S.mu, NULL);
    pthread_cond_init(&S.cv_work, NULL);
    pthread_cond_init(&S.cv_job, NULL);
    srand((unsigned)time(NULL) ^ (unsigned)getpid());

    /* SIGINT/SIGTERM go to sigwait below; every thread started after this inherits the mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV };
    struct addrinfo *ai = NULL;
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", o->port);
    int gr = getaddrinfo(o->host, port_s, &hints, &ai);
    if (gr != 0 || !ai) return cli_fail(CMD, CLI_USAGE, "--host %s: %s", o->host, gai_strerror(gr));
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, &S,
                                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(o->queue + 64),
                                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->idle_s,
                                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
                                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, &S,
                                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) return cli_fail(CMD, CLI_ERR, "cannot listen on %s:%d (%s)", o->host, o->port, strerror(errno));
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : o->port;
    const int v6 = strchr(o->host, ':') != NULL;   /* URLs bracket IPv6 literals */
    fprintf(stderr, "strata serve: listening on http://%s%s%s:%d (loading the model)\n", v6 ? "[" : "", o->host,
            v6 ? "]" : "", port);

    err e;
    err_clear(&e);
    engine_opts eo = o->st;   /* the streaming options, then the rest */
    eo.model_path = o->model;
    eo.n_threads = o->n_threads;
    eo.n_ctx = o->n_ctx;
    eo.n_batch = o->n_batch;
    eo.kv_type_k = o->kv_k;
    eo.kv_type_v = o->kv_v;
    eo.verbose = 1;
    eo.log = stderr;
    pthread_t worker;
    int worker_started = 0;
    rc = CLI_ERR;
    if (engine_open(&S.eng, &eo, &e) != 0) { cli_fail(CMD, CLI_ERR, "%s", e.msg); goto done; }
    if (session_create(&S.s, S.eng, &e) != 0) { cli_fail(CMD, CLI_ERR, "%s", e.msg); goto done; }
    if (!(S.hist = malloc(sizeof(int32_t) * (size_t)engine_n_ctx(S.eng)))) { cli_fail(CMD, CLI_ERR, "out of memory"); goto done; }
    if (engine_chat_apply(S.eng, o->chat_template, NULL, 0, 1, NULL, 0, &e) < 0)
        fprintf(stderr, "strata serve: warning: %s (chat completions will fail; completions work)\n", e.msg);
    engine_memory_plan(S.eng, &S.mem);
    if (!(S.eog = malloc(sizeof(int32_t) * (size_t)engine_n_vocab(S.eng)))) { cli_fail(CMD, CLI_ERR, "out of memory"); goto done; }
    for (int32_t t = 0; t < engine_n_vocab(S.eng); t++) if (engine_token_is_eog(S.eng, t)) S.eog[S.n_eog++] = t;
    S.have_stream = engine_streaming(S.eng);
    if (S.have_stream) engine_stream_occupancy(S.eng, &S.arena_slots, &S.arena_filled);
    if (pthread_create(&worker, NULL, worker_main, &S) != 0) { cli_fail(CMD, CLI_ERR, "cannot start the worker"); goto done; }
    worker_started = 1;
    atomic_store(&S.ready, 1);
    fprintf(stderr, "strata serve: ready on http://%s%s%s:%d, model '%s', context %d, queue %d\n", v6 ? "[" : "",
            o->host, v6 ? "]" : "", port, S.model_id, engine_n_ctx(S.eng), o->queue);

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "strata serve: %s: no new requests; finishing the one in flight\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM");
    rc = CLI_OK;
done:
    {
        MHD_socket ls = MHD_quiesce_daemon(d);
        if (ls != MHD_INVALID_SOCKET) close(ls);
    }
    pthread_mutex_lock(&S.mu);
    atomic_store(&S.stopping, 1);
    while (S.head) {   /* queued requests: 503 */
        job *j = S.head;
        S.head = j->next;
        S.n_queued--;
        job_finish(&S, j, 503, srv_error_json(503, "the server is shutting down"));
        job_unref(&S, j);
    }
    S.tail = NULL;
    pthread_cond_broadcast(&S.cv_work);
    pthread_mutex_unlock(&S.mu);
    if (worker_started) pthread_join(worker, NULL);
    /* every job is done; let the responses still being sent (the tail of a
     * stream, a big body) reach their clients before the daemon closes the
     * sockets: bounded, 10 s */
    for (int i = 0; i < 1000 && atomic_load(&S.active) > 0; i++) usleep(10000);
    MHD_stop_daemon(d);
    session_free(S.s);
    engine_close(S.eng);
    free(S.hist);
    free(S.eog);
    if (rc == CLI_OK) fprintf(stderr, "strata serve: stopped\n");
    return rc;
}
