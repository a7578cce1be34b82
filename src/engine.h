/* engine: strata's public C API. The CLI, the server, the eval tools and the
 * benches include this header and nothing below src/ (make check-includes).
 *
 * An `engine` is a loaded model (weights, tokenizer, kernels, thread pool);
 * a `session` is one timeline owning a KV cache and its forward scratch.
 * One engine may have several sessions, but sessions of one engine must not
 * evaluate concurrently (they share the thread pool).
 *
 * Errors: 0 or a negative ERR_* code plus a message in `err` (util/err.h).
 * The library never exits and never prints, except the load summary that
 * engine_open writes to opts.log when opts.verbose is set. */
#ifndef STRATA_ENGINE_H
#define STRATA_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "util/err.h"

typedef struct engine  engine;
typedef struct session session;

/* KV cache element types; the zero value is llama.cpp's default (f16). */
enum engine_kv_type { ENGINE_KV_F16 = 0, ENGINE_KV_F32 = 1 };

/* ==== Routed experts: all resident, or streamed (see "Expert streaming") ==== */
enum engine_evict { ENGINE_EVICT_LRU = 0, ENGINE_EVICT_LFU = 1 };
enum engine_io { ENGINE_IO_AUTO = 0, ENGINE_IO_URING = 1, ENGINE_IO_PREAD = 2 };
/* The hidden state read-ahead runs layer L+1's router on while layer L
 * computes: L's residual after its attention, or L's input. */
enum engine_ra_from { ENGINE_RA_ATTN = 0, ENGINE_RA_INPUT = 1 };
/* --arena auto: this fraction of the available memory (MemAvailable, or the
 * memory cgroup's limit if lower), less the resident part (non-expert
 * weights, one session's KV cache and scratch). */
#define ENGINE_ARENA_AUTO_FRACTION 0.75

typedef struct engine_opts {
    const char *model_path;   /* GGUF file (required) */
    int   n_threads;          /* <= 0: all online CPUs */
    int   n_ctx;              /* 0: min(model context length, 4096);
                                 ENGINE_CTX_TRAIN: the model's context length */
    int   n_batch;            /* rows per forward chunk: the prompt is evaluated in chunks
                                 of this many rows (llama.cpp's n_batch); <= 0: 2048.
                                 Clamped to n_ctx. */
    int   kv_type_k, kv_type_v; /* enum engine_kv_type */
    int   verbose;            /* print the load summary to `log` */
    FILE *log;                /* NULL: stderr */

    /* Expert streaming. stream = 0 (the default) maps the whole file: every
     * expert is resident. stream = 1 reads the non-expert tensors into
     * memory and streams the routed experts from disk through an arena. */
    int         stream;
    uint64_t    arena_bytes;     /* slot memory; 0: stream every lookup (I/O buffers only) */
    int         arena_auto;      /* size the arena from available memory (see above) */
    int         evict;           /* enum engine_evict */
    int         io_mode;         /* enum engine_io */
    int         io_threads;      /* pread workers (<= 0: 4) */
    int         io_depth;        /* io_uring reads in flight (<= 0: 4) */
    int         read_ahead;      /* top-N per row prefetched for the next layer; 0: off.
                                    Streaming: into the arena. With a backend and
                                    gpu_arena_bytes > 0: the device's read-ahead, into
                                    its arena (or the host tier when host_cache_bytes
                                    is set); with a backend and no device arena it is
                                    ERR_USAGE */
    int         read_ahead_from; /* enum engine_ra_from (a backend's read-ahead: ATTN only) */
    int         no_direct;       /* buffered reads instead of O_DIRECT */
    int         no_sidecar;      /* ignore MODEL.experts, read the GGUF */
    const char *sidecar_path;    /* NULL: MODEL.experts when it exists */
    const char *profile_path;    /* fill the arena from this profile's top at open (strata profile) */

    /* Routing observer: every layer's choices (n_rows x k expert ids,
     * row-major) on the coordinating thread, in every mode. */
    void      (*on_route)(void *ctx, int layer, const int32_t *experts, int n_rows, int k);
    void       *on_route_ctx;

    /* Routing policy spec (docs/ROUTING.md), e.g.
     * "prompt.chunk0=exact; prompt=bias(body=3,bonus=0.85,exact-last=32); decode=exact".
     * NULL: the environment's STRATA_ROUTE when set and not empty, else
     * "exact". A bad spec fails engine_open with ERR_USAGE naming the bad
     * part and its column (and STRATA_ROUTE when it came from there). */
    const char *route_spec;

    /* Device backend (backend/backend.h), e.g. the CUDA table of a program
     * built by `make cuda`; NULL: the CPU. With a backend every forward runs
     * on the device with the weights uploaded at open. Its routed experts
     * are all on the device, or (gpu_arena_bytes > 0) in a device arena
     * filled on a miss from host memory: the mapped file, or the host tier
     * (host_cache_bytes > 0), the expert store streaming from the SSD. The
     * CPU's streaming (stream = 1, --arena) does not apply (ERR_USAGE: the
     * store under the device is sized by host_cache_bytes), nor do per-row
     * logits (session_eval's all_logits: ERR_UNSUPPORTED), and an engine
     * has one device timeline: one session at a time (ERR_USAGE). */
    const struct backend_iface *backend;
    int gpu_layers;   /* llama.cpp's -ngl as given (0: not given): the backend
                         takes every layer, so 1..n_layer-1 is ERR_USAGE */
    uint64_t gpu_arena_bytes;   /* --gpu-arena: device bytes for the routed experts
                                   (0: all resident); needs a backend (ERR_USAGE) */
    /* --host-cache: the host-RAM tier between the device's expert arena and
     * the SSD. > 0 (with a backend and gpu_arena_bytes > 0, else ERR_USAGE;
     * with stream = 1 also ERR_USAGE): the engine opens the expert store as
     * streaming does (non-expert weights read into memory, the experts read
     * from the sidecar or GGUF by the I/O engine; evict, io_mode,
     * io_threads, io_depth, no_direct, sidecar_path, no_sidecar and
     * profile_path apply) with an arena of this many bytes, and the
     * backend's misses and read-ahead go through it; the backend page-locks
     * its slots when the system allows. Its counters are the stream
     * counters (engine_stream_*), per phase. 0: misses copy from the
     * mapped file. */
    uint64_t host_cache_bytes;
} engine_opts;

#define ENGINE_CTX_TRAIN (-1)

/* Open a model: parse the GGUF, check the architecture (qwen3moe; others are
 * ERR_UNSUPPORTED naming it), bind and validate every tensor, map the file
 * (or, streaming, read the non-expert tensors and set up the expert store,
 * filling it from opts.profile_path), build the tokenizer, start the thread
 * pool. *out owned by the caller. */
int  engine_open(engine **out, const engine_opts *o, err *e);
void engine_close(engine *eng);          /* NULL is a no-op */

/* Model facts. Strings are owned by the engine. */
int32_t     engine_n_vocab(const engine *eng);
int         engine_n_ctx(const engine *eng);        /* sessions' context size */
int         engine_n_ctx_train(const engine *eng);
int         engine_n_batch(const engine *eng);
int         engine_n_threads(const engine *eng);
const char *engine_arch(const engine *eng);         /* "qwen3moe" */
const char *engine_model_desc(const engine *eng);   /* one line: arch, shape, size, type mix */
const char *engine_backend_name(const engine *eng); /* "CPU", or the backend's name ("CUDA") */
uint64_t    engine_model_bytes(const engine *eng);  /* bytes of all tensors */
uint64_t    engine_model_params(const engine *eng);
const char *engine_chat_template(const engine *eng); /* tokenizer.chat_template or NULL */
double      engine_load_ms(const engine *eng);

/* Tokenizer (see tokenizer.h for semantics). */
int engine_tokenize(const engine *eng, const char *text, size_t len, int add_bos,
                    int parse_special, int32_t *ids, size_t cap, size_t *n_out, err *e);
/* Bytes of a token's text (CONTROL tokens only with special != 0); returns
 * the piece length (may exceed cap: truncated) or ERR_RANGE. */
int engine_token_piece(const engine *eng, int32_t id, int special, char *buf, size_t cap);
int engine_token_is_eog(const engine *eng, int32_t id);
int engine_add_bos(const engine *eng);
int32_t engine_token_bos(const engine *eng);          /* -1 if none */
int32_t engine_token_find(const engine *eng, const char *text);   /* exact token text, or -1 */

/* ==== Chat templates ==== */
typedef struct engine_chat_msg {
    const char *role;         /* "system", "user", "assistant" */
    const char *content;
} engine_chat_msg;

/* Format a conversation with a chat template: `name` selects a built-in
 * template by name (NULL: detect it from the model's tokenizer.chat_template).
 * add_assistant appends the assistant turn's opening. Writes at most cap
 * bytes (NUL-terminated when cap > 0) and returns the full length, or a
 * negative ERR_* (ERR_UNSUPPORTED: no template known for this model). */
int engine_chat_apply(const engine *eng, const char *name, const engine_chat_msg *msgs, size_t n_msgs,
                      int add_assistant, char *buf, size_t cap, err *e);

/* ==== Sessions ==== */

/* Allocates the KV cache (n_ctx positions) and the forward scratch (n_batch
 * rows): everything a session will ever use. *out owned by the caller. */
int  session_create(session **out, engine *eng, err *e);
void session_free(session *s);           /* NULL is a no-op */
int  session_n_past(const session *s);   /* tokens in the KV cache */
/* Drop cached tokens from position n_keep on (0 clears). */
void session_truncate(session *s, int n_keep);
/* Bytes the session holds (KV cache + scratch). */
uint64_t session_bytes(const session *s);

/* Append n tokens at positions n_past..n_past+n-1 (split into n_batch chunks
 * internally) and compute. If logits_out is not NULL it receives the logits
 * of the LAST token (n_vocab floats). If all_logits is not NULL it receives
 * n x n_vocab floats (row i = logits after token i). ERR_RANGE when the
 * context would overflow or an id is out of the vocabulary; ERR_IO when the
 * model file changed on disk. On error n_past is unchanged. Allocates
 * nothing. */
int session_eval(session *s, const int32_t *ids, int n, float *logits_out,
                 float *all_logits, err *e);

/* What the forward did in one phase (enum engine_phase) of this session,
 * summed over its chunks since session_create: the figures a speed report
 * divides by (weight bytes touched per token, distinct experts per chunk
 * against the uniform-routing expectation N * (1 - (1 - k/N)^rows)). */
typedef struct session_stats {
    uint64_t chunks, rows;          /* forward chunks (decode: tokens), rows */
    uint64_t moe_layers;            /* (chunk, layer) MoE blocks run */
    uint64_t expert_slots;          /* routed row-slots (rows x k) */
    uint64_t expert_lookups;        /* distinct experts per (chunk, layer), summed */
    double   expert_lookups_uniform;/* the same under uniform routing */
    uint64_t expert_bytes;          /* weight bytes of those experts (gate+up+down) */
    uint64_t dense_bytes;           /* other weight bytes read (attention, router,
                                       norms, embedding rows, head where it ran) */
    double   expert_ms;             /* wall time of the routed-expert matmul jobs
                                       (waits for expert reads included) */
} session_stats;
void session_stats_get(const session *s, int phase, session_stats *out);

/* ==== Memory ==== */
typedef struct engine_memory {
    int      streaming;      /* an expert store is open (--arena, or --host-cache under a backend) */
    uint64_t weights;        /* resident weights: the mapped file, or the non-expert tensors */
    uint64_t arena;          /* expert arena: the CPU's, or the host tier under a
                                backend's (0 when all resident) */
    uint64_t kv;             /* KV cache, per session */
    uint64_t scratch;        /* forward scratch, per session */
    uint64_t total;          /* weights + arena + kv + scratch: one session */
} engine_memory;
/* What the engine and one session will hold (what the load summary prints). */
void engine_memory_plan(const engine *eng, engine_memory *out);

/* ==== Expert streaming ====
 * Counters per phase: a session_eval of several tokens is the prompt phase
 * (each forward chunk of it a prompt chunk), one token is the decode phase.
 * They accumulate for the life of the engine; no phase erases another. */
enum engine_phase { ENGINE_PHASE_PROMPT = 0, ENGINE_PHASE_DECODE = 1 };

typedef struct engine_stream_counters {
    uint64_t chunks, rows;          /* forward chunks (decode: tokens), rows */
    uint64_t lookups;               /* distinct layer-experts wanted per chunk, summed */
    uint64_t hits, ahead, misses;   /* in the arena / prefetched / read on demand */
    uint64_t streamed_in;           /* experts read (slot fills), of them prefetches: */
    uint64_t streamed_in_prefetch;
    uint64_t submissions;           /* read requests */
    uint64_t reads;                 /* read operations (continuations included) */
    uint64_t bytes;                 /* bytes read */
    uint64_t predicted, predicted_used, lookups_predicted;  /* read-ahead accuracy */
    uint64_t prefetch_wasted;       /* prefetched experts dropped unused */
    uint64_t extra_waves;           /* a layer's experts did not fit in the arena at once */
    uint64_t io_errors;
    double   host_ms, wait_ms;      /* wall time of the chunks, of it waiting for reads */
} engine_stream_counters;

int  engine_streaming(const engine *eng);
/* Fill empty arena slots from a ranked list of n (layer, expert) pairs
 * (pairs[2i], pairs[2i+1]), best first; reported by the init line. */
int  engine_stream_warm(engine *eng, const int32_t *pairs, uint64_t n, err *e);
/* "expert arena 6.50 GB, 4129 slots in 2 size classes, ..." (see xstore.h);
 * 0 and an empty string when not streaming. */
int  engine_stream_init_line(const engine *eng, char *buf, size_t cap);
/* Arena occupancy: slots in the arena and slots holding a resident expert
 * now. ERR_USAGE when not streaming. Takes the store's lock (for metrics). */
int  engine_stream_occupancy(engine *eng, int *n_slots, int *n_filled);
/* ERR_USAGE when not streaming. */
int  engine_stream_counters_get(const engine *eng, int phase, engine_stream_counters *out);
/* One human line per phase that ran (--trace), when the experts are
 * streamed (also the host tier under a backend); then, when a backend with
 * an expert arena is open, one line of its counters ("gpu arena: 1536
 * slots, 12345 lookups, hit rate 0.53, 755.1 MB copied (prefetched 900,
 * used 812), host memory pinned 6.00 GB"). */
void engine_stream_trace(const engine *eng, FILE *out);
/* The stream report as a JSON object ("null" when not streaming); `indent`
 * prefixes its lines after the first. */
void engine_stream_report_json(const engine *eng, FILE *out, const char *indent);
/* Tests only: make chosen expert reads fail, come back short or late
 * ("eio:N", "short:N", "eof:N", "late:N:MS", then ",count=C", ",every=E",
 * ",demand"; see expert/xio.h). NULL disarms. ERR_USAGE when not streaming
 * or for a bad spec. */
int  engine_stream_fault(engine *eng, const char *spec, err *e);

/* ==== Device backend ====
 * The device's expert arena (engine_opts.gpu_arena_bytes), counted since
 * engine_open; zeros when every expert is on the device. */
typedef struct engine_gpu_stats {
    int      n_slots;           /* experts the device arena holds (0: no arena) */
    uint64_t hits, misses;      /* lookups: one per routed expert per layer per row */
    uint64_t bytes_h2d;         /* expert bytes copied host -> device (misses and prefetches) */
    uint64_t prefetched;        /* experts copied ahead by read-ahead */
    uint64_t prefetch_used;     /* of them, looked up by their layer before eviction */
    uint64_t pinned_bytes;      /* host memory page-locked for the copies (0: pageable) */
} engine_gpu_stats;
/* ERR_USAGE (and zeros) when the engine runs on the CPU. */
int engine_backend_stats(const engine *eng, engine_gpu_stats *out);

/* ==== Routing policy (docs/ROUTING.md) ====
 * Three arms: the first chunk of a prompt, its later chunks, decode. */
enum engine_route_arm { ENGINE_ROUTE_CHUNK0 = 0, ENGINE_ROUTE_PROMPT = 1, ENGINE_ROUTE_DECODE = 2,
                        ENGINE_ROUTE_N_ARMS = 3 };

/* The canonical effective policy ("exact", or "prompt.chunk0=...; prompt=...;
 * decode=..."); snprintf's contract. */
int engine_route_describe(const engine *eng, char *buf, size_t cap);
/* Parse a spec without a model (front ends check --route early): 0 and the
 * canonical string in desc (when desc is not NULL), or ERR_USAGE naming the
 * bad part and its column. body is checked against the model only by
 * engine_open. */
int engine_route_spec_check(const char *spec, char *desc, size_t cap, err *e);
/* 1 when some arm reads expert residency: its routing then depends on the
 * arena's state and on I/O timing (not reproducible bit for bit). */
int engine_route_reads_residency(const engine *eng);

/* Per arm, summed over the engine's life (all sessions). Row counts are
 * summed over layers (a row routed in 4 layers counts 4). */
typedef struct engine_route_counters {
    uint64_t blocks;                 /* (chunk, layer) MoE blocks routed */
    uint64_t rows, rows_biased;      /* rows routed; of them with a bonus > 0 */
    uint64_t slots_changed;          /* row-slots not in the row's exact top-k */
    uint64_t slots_changed_resident; /* of them resident: selections the bias caused */
    uint64_t lookups;                /* distinct experts per block, summed */
    uint64_t lookups_exact;          /* the same had the rows been routed exactly */
    uint64_t masked_blocks;          /* blocks that read residency, and in them: */
    uint64_t masked_lookups, masked_resident;             /* distinct chosen, of them resident */
    uint64_t masked_lookups_exact, masked_resident_exact; /* distinct exact top-k, of them resident */
} engine_route_counters;
/* ERR_USAGE for a bad arm. */
int  engine_route_counters_get(const engine *eng, int arm, engine_route_counters *out);
/* The expert-stream counters of the chunks an arm routed (the first chunk
 * of each prompt evaluation, its later chunks, decode tokens): hits, misses,
 * bytes ... as engine_stream_counters_get gives per phase; the prompt phase
 * is the sum of the first two arms. Reads are attributed to the chunk in
 * which they completed. ERR_USAGE when not streaming or for a bad arm. */
int  engine_route_stream_counters_get(const engine *eng, int arm, engine_stream_counters *out);
/* One human line per arm that routed something (--trace); when streaming it
 * ends with the arm's store counters ("; store: ..."). */
void engine_route_trace(const engine *eng, FILE *out);
/* {"policy": "...", "reads_residency": b, "arms": {"prompt.chunk0": {...}, ...}};
 * each arm also has "stream": its store counters (chunks, rows, lookups,
 * hits, ahead, misses, streamed_in, reads, bytes, host_ms, wait_ms), or
 * null when not streaming. `indent` prefixes its lines after the first. */
void engine_route_report_json(const engine *eng, FILE *out, const char *indent);

/* ==== Sampling (llama.cpp's sampler chain semantics) ====
 * The chain is llama.cpp's default for llama-cli / llama-completion:
 * penalties -> top_k -> top_p -> min_p -> temperature -> dist, each stage
 * as in src/llama-sampling.cpp (same candidate order, float/double sums).
 * dist draws from std::mt19937 seeded with `seed` and a uniform double in
 * [0, 1) made from two 32-bit outputs (libstdc++ generate_canonical), so
 * the same seed and logits give llama.cpp's token. temp <= 0 is greedy:
 * argmax after the penalties, the lowest id winning ties. */
typedef struct sampler_opts {
    float    temp;            /* <= 0: greedy; default 0.8 */
    int      top_k;           /* <= 0: off; default 40 */
    float    top_p;           /* >= 1: off; default 0.95 */
    float    min_p;           /* <= 0: off; default 0.05 */
    float    repeat_penalty;  /* 1: off (default) */
    int      repeat_last_n;   /* tokens the penalty looks back; 0: off; default 64 */
    uint32_t seed;
} sampler_opts;

typedef struct sampler sampler;
/* llama.cpp's defaults: temp 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat
 * 1.0 over 64; seed 0 (callers pick a random seed when the user gives none). */
sampler_opts sampler_default_opts(void);
/* Allocates the candidate array and the penalty window (n_vocab entries). */
int  sampler_open(sampler **out, const sampler_opts *o, int32_t n_vocab, err *e);
void sampler_close(sampler *sm);          /* NULL is a no-op */
/* Remember an accepted token (prompt tokens too, as llama.cpp does): the
 * repeat penalty counts the last repeat_last_n accepted tokens. */
void sampler_accept(sampler *sm, int32_t id);
/* Pick the next token from n_vocab logits (not modified). Allocates nothing. */
int32_t sampler_sample(sampler *sm, const float *logits);

/* ==== Model identity (eval dumps) ====
 * gguf_fingerprint of the model file (FNV-1a 64 of the GGUF header bytes,
 * continued over the file size): what `strata inspect` prints as
 * "fingerprint". Same file, same value; a different file almost surely a
 * different one. */
uint64_t engine_model_fingerprint(const engine *eng);

#endif
