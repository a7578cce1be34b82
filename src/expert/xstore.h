/* xstore: the expert store. Routed experts come from disk (through xio) into
 * a fixed arena of slots in RAM; the forward reads them through the
 * expert_src interface (model/expert_src.h) that xstore_src() returns.
 *
 * ==== Arena ====
 * One anonymous mapping, allocated at open and never grown, cut into slots
 * of a few size classes: one class per distinct xlayout_slot_bytes() value
 * among the layers (layers whose experts have the same types share a
 * class). A budget of B bytes is split between the classes in proportion to
 * the expert bytes of their layers (so every layer keeps about the same
 * share of its experts), at least MIN_SLOTS (2) slots per class, never
 * more slots than the class has layer-experts. Slots are page aligned
 * (O_DIRECT) and, under io_uring, registered as fixed buffers when the
 * kernel allows it (registration pins the whole arena: the memory plan
 * counts all of it anyway).
 * arena_bytes == 0 is the streaming mode: every class gets 2 x max(k,
 * read-ahead) slots used only as I/O buffers, and a slot is released when
 * its layer ends, so every lookup is a read (prefetched or not).
 *
 * ==== Slots ====
 * A slot is EMPTY, LOADING (reads in flight; demand or prefetch priority),
 * RESIDENT or FAILED (a read failed: it holds nothing; a later lookup of
 * the same expert reads it again). A slot is pinned while the current layer
 * uses it, and protected while it holds a prediction for an upcoming layer
 * (or the next wave of the current one). Pinned, LOADING and protected
 * slots are never evicted by a prefetch; a demand may take a protected one
 * (a guess never blocks a need).
 *
 * ==== Lookups and waves ====
 * begin_layer(L, experts, n) classifies the distinct experts of the chunk
 * (first call of a layer only): in the arena (resident or loading from a
 * demand or the warm fill), streamed ahead (loading or loaded by a
 * prefetch and not yet used), or missed. It pins what is there, evicts and
 * submits demand reads for the rest, and returns k: experts[0..k) (which it
 * may reorder, hits first) is the wave the caller computes after
 * wait_layer; then end_layer and begin_layer(L, experts + k, n - k) again.
 * k == n unless the layer's set does not fit in its class: then the wave
 * takes the hits and half of the free slots, and the other half already
 * read the next wave (double buffering). The minimum arena is thus two
 * slots per class, whatever the chunk; waves are exact because every expert
 * writes only its own rows (qwen3moe.c).
 *
 * ==== Eviction ====
 * Behind one interface (struct policy in xstore.c):
 *   XSTORE_EVICT_LRU  least recently used first;
 *   XSTORE_EVICT_LFU  least frequently used first, with aging: every
 *                     layer-expert keeps a lookup count across evictions,
 *                     all counts are halved every 16 x (arena slots, at
 *                     least 64) lookups, so stale popularity fades; ties go
 *                     to the least recent. (Aging every 1x slots made it
 *                     LRU-like: 0.49 -> 0.63 of decode lookups in the arena
 *                     at 16x on a Zipf-1.0 model with a quarter of its
 *                     experts in the arena; LRU 0.49.)
 * A wrong guess (prefetched, not used by its layer) is moved to the cold
 * end. Failed and empty slots go first.
 *
 * ==== Counters ====
 * Per phase (prompt, decode), per routing arm (the first chunk of a prompt,
 * its later chunks, decode: xstore_chunk_begin_at's index) and per chunk
 * (xstore_chunk_begin/end), kept for the whole life of the store; see
 * xstore_counters. Reads and bytes are the I/O engine's (every operation,
 * continuations included), attributed to the chunk in which they completed
 * (a read-ahead submitted at the end of one chunk and finished in the next
 * counts in the next, and so in its arm).
 *
 * Thread-safety: one coordinating thread calls everything except
 * expert_src_get, which any thread may call between begin_layer/wait_layer
 * and end_layer. I/O completions arrive on xio's threads and are handled
 * under the store's mutex. */
#ifndef STRATA_XSTORE_H
#define STRATA_XSTORE_H

#include <stdint.h>
#include <stdio.h>

#include "expert/xio.h"
#include "expert/xlayout.h"
#include "model/expert_src.h"
#include "util/err.h"

typedef struct xstore xstore;

/* Where the experts are. The engine fills it from an xlayout
 * (xstore_layout_from_xlayout); tests may describe any layout. The
 * callbacks are pure lookups. */
typedef struct xstore_layout {
    int         n_layer, n_expert;
    int         fd;           /* borrowed: the file the reads go to */
    int         direct;       /* fd is O_DIRECT */
    const char *desc;         /* "sidecar /path" or "GGUF /path" (borrowed, for reports) */
    const void *ctx;
    uint64_t  (*slot_bytes)(const void *ctx, int layer);
    int       (*reads)(const void *ctx, int layer, int expert, xread reads[XLAYOUT_MAX_READS]);
    uint64_t  (*part_off)(const void *ctx, int layer, int expert, int which);
} xstore_layout;

/* A layout view of x (borrowed: x must outlive the store). */
void xstore_layout_from_xlayout(xstore_layout *out, const xlayout *x);

enum xstore_evict { XSTORE_EVICT_LRU = 0, XSTORE_EVICT_LFU = 1 };
enum xstore_phase { XSTORE_PROMPT = 0, XSTORE_DECODE = 1, XSTORE_N_PHASES = 2 };
/* Routing arms of a chunk, numbered as route/route.h's route_arm_id (the
 * store does not depend on the routing module): prompt chunk 0, later
 * prompt chunks, decode. */
enum xstore_arm { XSTORE_ARM_CHUNK0 = 0, XSTORE_ARM_PROMPT = 1, XSTORE_ARM_DECODE = 2, XSTORE_N_ARMS = 3 };

typedef struct xstore_opts {
    uint64_t arena_bytes;    /* slot memory; 0: streaming buffers only */
    int      evict;          /* enum xstore_evict */
    int      io_mode;        /* enum xio_mode */
    int      io_threads;     /* pread workers (<= 0: 4) */
    int      io_depth;       /* io_uring reads in flight (<= 0: 4) */
    int      n_expert_used;  /* k (sizes the streaming buffers) */
    int      read_ahead;     /* top-N the forward prefetches (reports, buffers) */
    int      no_register;    /* do not register the arena with io_uring */
    int      max_chunks;     /* per-chunk records kept (<= 0: 4096); later ones are counted as dropped */
    int      n_compute;      /* threads that call wait_expert (<= 0: 1): wait_ms counts
                                only time when all of them are blocked */
} xstore_opts;

/* Minimum slots per size class (see "waves"). */
#define XSTORE_MIN_SLOTS 2

/* Open the store: classes, arena, I/O engine. ERR_USAGE when arena_bytes
 * is non-zero but below the minimum (the message names it), ERR_NOMEM,
 * ERR_UNSUPPORTED (io_uring asked for and missing). *out owned by the caller. */
int  xstore_open(xstore **out, const xstore_layout *lay, const xstore_opts *o, err *e);
/* Stops I/O (waits for reads in flight), frees the arena. NULL is a no-op. */
void xstore_close(xstore *s);

/* The expert_src the forward uses (borrowed; valid until xstore_close). */
expert_src *xstore_src(xstore *s);

/* Bytes the arena needs for a budget (what xstore_open would allocate),
 * without allocating: for memory plans. 0 and ERR_USAGE as xstore_open. */
int xstore_plan(const xstore_layout *lay, const xstore_opts *o, uint64_t *arena_bytes, err *e);

/* ==== Chunks and phases ==== */
/* Bracket one forward chunk of n_rows rows (a prompt chunk or one decoded
 * token). Counters between the calls go to that chunk, its phase and its
 * arm. xstore_chunk_begin_at also takes the chunk's index within its
 * evaluation call (session_eval: 0 for the first chunk): the arm is
 * XSTORE_ARM_DECODE for phase XSTORE_DECODE, else XSTORE_ARM_CHUNK0 for
 * index 0 and XSTORE_ARM_PROMPT for index > 0 (what route_arm_for gives).
 * xstore_chunk_begin(s, phase, n) is xstore_chunk_begin_at(s, phase, 0, n):
 * each of its prompt chunks counts as the first of its call. */
void xstore_chunk_begin(xstore *s, int phase, int n_rows);
void xstore_chunk_begin_at(xstore *s, int phase, int index, int n_rows);
void xstore_chunk_end(xstore *s);
/* "prompt.chunk0", "prompt", "decode" (route_arm_name's words); "?" otherwise. */
const char *xstore_arm_name(int arm);

/* ==== Warm fill ==== */
/* Fill empty slots from a ranked list of n (layer, expert) pairs (pairs[2i],
 * pairs[2i+1]), best first, until every class is full or the list ends;
 * never evicts. Waits for the reads. The result goes to the init line.
 * ERR_RANGE for a pair out of range, ERR_IO for a failed read. */
int xstore_warm(xstore *s, const int32_t *pairs, uint64_t n, err *e);

/* ==== Residency ==== */
/* mask[e] = 1 if expert e of `layer` is resident or loading, else 0. */
void xstore_resident_mask(xstore *s, int layer, uint8_t *mask);

/* ==== Counters ==== */
typedef struct xstore_counters {
    uint64_t chunks, rows;          /* forward chunks, rows (tokens) */
    uint64_t lookups;               /* distinct layer-experts wanted, summed over layers and chunks */
    uint64_t hits;                  /* in the arena (not from a prefetch) */
    uint64_t ahead;                 /* prefetched, resident or still in flight, not used before */
    uint64_t misses;                /* absent: read on demand */
    uint64_t loads;                 /* experts streamed in (slot fills submitted) */
    uint64_t loads_prefetch;        /* of them prefetches */
    uint64_t submissions;           /* read requests submitted to the I/O engine */
    uint64_t reads;                 /* read operations performed (continuations included) */
    uint64_t bytes;                 /* bytes read */
    uint64_t predicted;             /* read-ahead: distinct layer-experts predicted */
    uint64_t predicted_used;        /* of them, looked up by their layer */
    uint64_t lookups_predicted;     /* lookups of layers that had a prediction */
    uint64_t prefetch_wasted;       /* prefetched experts dropped without use */
    uint64_t waves;                 /* extra waves (a layer's set larger than its class) */
    uint64_t io_errors;             /* failed reads (demand or prefetch) */
    double   host_ms;               /* wall time of the chunks */
    double   wait_ms;               /* of it, blocked waiting for reads */
} xstore_counters;

/* Totals of a phase (all its chunks). */
void xstore_phase_counters(const xstore *s, int phase, xstore_counters *out);
/* Lookups of each layer in a phase: n_layer values (borrowed). */
const uint64_t *xstore_phase_layer_lookups(const xstore *s, int phase);
/* Totals of an arm (enum xstore_arm; zeros for another value). */
void xstore_arm_counters(const xstore *s, int arm, xstore_counters *out);
/* Recorded chunks, in order; chunk i's phase and counters. */
int  xstore_n_chunks(const xstore *s);
int  xstore_chunk(const xstore *s, int i, int *phase, xstore_counters *out);
/* Chunk i's index within its call and its arm (ERR_RANGE for a bad i;
 * either pointer may be NULL). */
int  xstore_chunk_arm(const xstore *s, int i, int *index, int *arm);

/* ==== Facts and reports ==== */
uint64_t xstore_arena_bytes(const xstore *s);
/* The arena's one anonymous mapping: *base and its length *bytes (==
 * xstore_arena_bytes; every slot, and so every pointer expert_src_get
 * returns, lies inside it), also in the streaming mode (arena 0: the I/O
 * buffer slots). NULL / 0 if there is none. For a device backend to
 * page-lock (cudaHostRegister) the slots it copies from; the memory stays
 * owned by the store and is unmapped by xstore_close, so unregister it
 * before. */
void     xstore_arena_span(const xstore *s, void **base, uint64_t *bytes);
int      xstore_n_slots(const xstore *s);
/* Slots holding a resident expert right now (not empty, loading or failed).
 * Takes the store's lock: for metrics, not for the decode loop. */
int      xstore_n_filled(xstore *s);
int      xstore_n_classes(const xstore *s);
const xio *xstore_io(const xstore *s);
/* "expert arena 6.50 GB, 4129 slots in 2 size classes, 4129 experts read
 * from the profile's top (24576 ranked) in 1.6 s (3.89 GB/s); 8 I/O
 * threads, read-ahead top 6" (without a warm fill: "no warm fill"), then
 * "; <eviction>, <xio description>". Returns snprintf's length. */
int  xstore_init_line(const xstore *s, char *buf, size_t cap);
/* One human line per phase that ran (the seed's format plus effective
 * bandwidth and read-ahead accuracy). */
void xstore_trace(const xstore *s, FILE *out);
/* A JSON object: configuration, warm fill, phases (with per-layer
 * lookups), arms ("prompt.chunk0", "prompt", "decode": the phase counters
 * without per-layer lookups) and chunks (each with its "index" within its
 * call and its "arm"). `indent` prefixes every line after the first. */
void xstore_report_json(const xstore *s, FILE *out, const char *indent);

/* ==== Tests ==== */
/* Arm an injected fault in the I/O engine (xio_fault_set). */
void xstore_set_fault(xstore *s, const xio_fault *f);
/* Check the invariants (map <-> slots, pins, classes) while no layer is
 * begun: ERR_INTERNAL naming the first violation. */
int  xstore_check(xstore *s, err *e);

#endif
