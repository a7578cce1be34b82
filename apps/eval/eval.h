/* eval: what the measurement commands (perplexity.c, tfdump.c, kld.c)
 * share: the engine flags they all accept, the teacher-forced dump layout,
 * and the rendering of token text for tables and JSON.
 *
 * Header-only (static inline): the three commands are the only users and
 * each takes what it needs; nothing here holds state. The dump layout is
 * written down once, here and in docs/EVAL.md; tfdump.c writes it and
 * kld.c reads it. Host byte order is assumed little-endian, as it is for
 * llama.cpp's base files (x86-64, arm64). */
#ifndef STRATA_EVAL_H
#define STRATA_EVAL_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "engine.h"

/* ==== Engine flags ====
 * Threads, forward chunk, KV types and expert streaming: the same spelling
 * and meaning as `strata run`. The model (-m) and the context (-c) are each
 * command's own, because their meaning differs (llama-perplexity's -c is
 * the chunk length). */

static inline void eval_engine_flags_help(FILE *out)
{
    fprintf(out,
            "  -t, --threads N           threads (default: all CPUs)\n"
            "  -b, --batch-size N        rows per forward pass (default 2048; -ub is the same)\n"
            "  -ctk, --cache-type-k T    KV cache type for K: f16 (default) or f32\n"
            "  -ctv, --cache-type-v T    KV cache type for V: f16 (default) or f32\n"
            "  --arena SIZE|auto|0       stream the routed experts through an arena (see strata run --help)\n"
            "  --evict lru|lfu  --io auto|uring|pread  --io-threads N  --io-depth N\n"
            "  --read-ahead N  --read-ahead-from attn|input  --no-direct\n"
            "  --sidecar FILE  --no-sidecar  --profile FILE\n"
            "                            expert streaming options, as strata run\n"
            "  --route SPEC              routing policy (docs/ROUTING.md; default exact, or STRATA_ROUTE)\n");
}

/* If argv[*i] is an engine flag, consume it (and its value, advancing *i)
 * into *o and return 1; return 0 if it is not one; -1 after printing a
 * one-line usage error ("strata <cmd>: ..."). */
static inline int eval_engine_flag(const char *cmd, int argc, char **argv, int *i, engine_opts *o)
{
    const char *a = argv[*i];
    const char *v;
    long long n;
#define EV_IS(s) (!strcmp(a, s))
#define EV_VALUE() do { if (!(v = cli_value(cmd, argc, argv, i))) return -1; } while (0)
#define EV_INT(lo, hi, dst) do { EV_VALUE(); if (cli_parse_int(v, lo, hi, &n)) { \
        cli_fail(cmd, CLI_USAGE, "%s needs a whole number from %lld to %lld, got '%s'", a, \
                 (long long)(lo), (long long)(hi), v); return -1; } (dst) = (int)n; } while (0)
    if (EV_IS("-t") || EV_IS("--threads")) EV_INT(1, 1024, o->n_threads);
    else if (EV_IS("-b") || EV_IS("--batch-size") || EV_IS("-ub") || EV_IS("--ubatch-size"))
        EV_INT(1, 1 << 20, o->n_batch);
    else if (EV_IS("-ctk") || EV_IS("--cache-type-k") || EV_IS("-ctv") || EV_IS("--cache-type-v")) {
        EV_VALUE();
        int t = !strcmp(v, "f16") ? ENGINE_KV_F16 : !strcmp(v, "f32") ? ENGINE_KV_F32 : -1;
        if (t < 0) { cli_fail(cmd, CLI_USAGE, "%s must be f16 or f32, got '%s'", a, v); return -1; }
        if (a[3] == 'k' || !strcmp(a, "--cache-type-k")) o->kv_type_k = t; else o->kv_type_v = t;
    }
    else return cli_stream_flag(cmd, argc, argv, i, o);
    return 1;
#undef EV_IS
#undef EV_VALUE
#undef EV_INT
}

/* ==== Teacher-forced dump (strata tfdump writes, strata kld reads) ====
 * Version 1, little-endian, no padding (docs/EVAL.md has the same table):
 *
 *   off  size  field
 *     0     8  magic "STRATATF"
 *     8     4  uint32 version (1)
 *    12     4  uint32 header_bytes: offset of the logits (= the sum of all below but the logits)
 *    16     8  uint64 model fingerprint (engine_model_fingerprint)
 *    24     4  int32  n_vocab
 *    28     4  int32  n_tokens   prompt + targets
 *    32     4  int32  n_prompt   tokens before the first target (>= 1)
 *    36     4  int32  n_eval     evaluation positions (>= 1)
 *    40     4  uint32 routing_bytes
 *    44     4  uint32 desc_bytes
 *    48     4  uint32 vocab_bytes
 *    52     -  routing configuration (routing_bytes, no NUL): the effective
 *              policy, engine_route_describe ("exact", or "prompt.chunk0=...;
 *              prompt=...; decode=..."), then " (reads residency)" when
 *              some arm depends on it
 *     .     -  model description (desc_bytes, engine_model_desc, informational)
 *     .     -  int32 tokens[n_tokens]
 *     .     -  int32 positions[n_eval]: index in tokens[] of each target; its
 *              logits are the row after token positions[i] - 1
 *     .     -  vocabulary: n_vocab x (uint32 length, bytes): each id's piece,
 *              control tokens shown (engine_token_piece special=1)
 *   header_bytes  float32 logits[n_eval][n_vocab]
 *
 * The file is exactly header_bytes + 4 * n_eval * n_vocab bytes. */
#define EVAL_DUMP_MAGIC   "STRATATF"
#define EVAL_DUMP_VERSION 1u
#define EVAL_DUMP_FIXED   52u    /* bytes before the routing string */
#define EVAL_ROUTING_EXACT "exact"

/* ==== Token text ====
 * Token pieces are bytes: a byte-level token may be a lone or cut UTF-8
 * byte. Both renderings keep printable ASCII and well-formed UTF-8 as is
 * and show any other byte as the four characters \xNN. */

/* Length of the well-formed UTF-8 sequence at s[0..n) (2..4), or 0. */
static inline size_t eval_utf8_len(const unsigned char *s, size_t n)
{
    const unsigned char c = s[0];
    size_t need = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (need == 0 || need > n) return 0;
    for (size_t k = 1; k < need; k++)
        if ((s[k] & 0xc0) != 0x80) return 0;
    if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0)) return 0;   /* overlong, surrogate */
    if ((c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] >= 0x90)) return 0;   /* overlong, > U+10FFFF */
    return need;
}

/* One-line table cell: \n \r \t \\ escaped, other bytes below 0x20, 0x7f
 * and bytes of no well-formed UTF-8 sequence as \xNN. Always NUL-terminates
 * when cap > 0; truncates between characters. */
static inline void eval_escape(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    if (cap == 0) return;
    for (size_t i = 0; i < n;) {
        const unsigned char c = (unsigned char)s[i];
        char tmp[8];
        size_t len, used = 1, u;
        if (c == '\n') { memcpy(tmp, "\\n", 2); len = 2; }
        else if (c == '\r') { memcpy(tmp, "\\r", 2); len = 2; }
        else if (c == '\t') { memcpy(tmp, "\\t", 2); len = 2; }
        else if (c == '\\') { memcpy(tmp, "\\\\", 2); len = 2; }
        else if (c >= 0x20 && c < 0x7f) { tmp[0] = (char)c; len = 1; }
        else if ((u = eval_utf8_len((const unsigned char *)s + i, n - i)) != 0) { memcpy(tmp, s + i, u); len = used = u; }
        else { snprintf(tmp, sizeof tmp, "\\x%02x", c); len = 4; }
        if (o + len + 1 > cap) break;
        memcpy(out + o, tmp, len);
        o += len;
        i += used;
    }
    out[o] = '\0';
}

/* The bytes as a JSON string: the real text where it is text (newlines are
 * \n in JSON and decode to newlines), and the characters \xNN (JSON
 * "\\xNN") for a byte of no well-formed UTF-8 sequence. */
static inline void eval_json_bytes(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        const unsigned char c = (unsigned char)s[i];
        size_t u;
        if (c == '"') fputs("\\\"", f);
        else if (c == '\\') fputs("\\\\", f);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f) fprintf(f, "\\u%04x", c);
        else if (c < 0x80) fputc(c, f);
        else if ((u = eval_utf8_len((const unsigned char *)s + i, n - i)) != 0) { fwrite(s + i, 1, u, f); i += u; continue; }
        else fprintf(f, "\\\\x%02x", c);
        i++;
    }
    fputc('"', f);
}

#endif
