/* cli_util: shared argument helpers for the subcommands (see cli.h). */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_fail(const char *cmd, int code, const char *fmt, ...)
{
    fprintf(stderr, "strata %s: ", cmd);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return code;
}

int cli_parse_int(const char *s, long long lo, long long hi, long long *out)
{
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int cli_parse_float(const char *s, double *out)
{
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || v != v) return -1;
    *out = v;
    return 0;
}

int cli_parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0 || v != v) return -1;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'B') end++;
    if (*end == 'B') end++;
    if (*end) return -1;
    double b = v * mul;
    if (b > 1.8e19) return -1;
    *out = (uint64_t)b;
    return 0;
}

const char *cli_value(const char *cmd, int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        cli_fail(cmd, CLI_USAGE, "option %s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_stream_flag(const char *cmd, int argc, char **argv, int *i, engine_opts *o)
{
    const char *a = argv[*i], *v;
    long long n;
#define IS(s) (!strcmp(a, s))
#define VALUE() do { if (!(v = cli_value(cmd, argc, argv, i))) return -1; } while (0)
#define INT(lo, hi, dst) do { VALUE(); if (cli_parse_int(v, lo, hi, &n)) { \
        cli_fail(cmd, CLI_USAGE, "%s needs a whole number from %lld to %lld, got '%s'", a, \
                 (long long)(lo), (long long)(hi), v); return -1; } (dst) = (int)n; } while (0)
#define BAD(...) do { cli_fail(cmd, CLI_USAGE, __VA_ARGS__); return -1; } while (0)
    if (IS("--arena")) {
        VALUE();
        o->stream = 1;
        if (!strcmp(v, "auto")) o->arena_auto = 1;
        else if (cli_parse_size(v, &o->arena_bytes))
            BAD("--arena needs a size (K/M/G suffixes), 0 or auto, got '%s'", v);
    } else if (IS("--evict")) {
        VALUE();
        if (!strcmp(v, "lru")) o->evict = ENGINE_EVICT_LRU;
        else if (!strcmp(v, "lfu")) o->evict = ENGINE_EVICT_LFU;
        else BAD("--evict must be lru or lfu, got '%s'", v);
    } else if (IS("--io")) {
        VALUE();
        if (!strcmp(v, "auto")) o->io_mode = ENGINE_IO_AUTO;
        else if (!strcmp(v, "uring")) o->io_mode = ENGINE_IO_URING;
        else if (!strcmp(v, "pread")) o->io_mode = ENGINE_IO_PREAD;
        else BAD("--io must be auto, uring or pread, got '%s'", v);
    } else if (IS("--io-threads")) INT(1, 256, o->io_threads);
    else if (IS("--io-depth")) INT(1, 256, o->io_depth);
    else if (IS("--read-ahead")) INT(0, 65536, o->read_ahead);
    else if (IS("--read-ahead-from")) {
        VALUE();
        if (!strcmp(v, "attn")) o->read_ahead_from = ENGINE_RA_ATTN;
        else if (!strcmp(v, "input")) o->read_ahead_from = ENGINE_RA_INPUT;
        else BAD("--read-ahead-from must be attn or input, got '%s'", v);
    } else if (IS("--no-direct")) o->no_direct = 1;
    else if (IS("--no-sidecar")) o->no_sidecar = 1;
    else if (IS("--sidecar")) { VALUE(); o->sidecar_path = v; }
    else if (IS("--profile")) { VALUE(); o->profile_path = v; }
    else if (IS("--gpu")) {   /* every layer on the GPU (build/cuda/strata) */
        if (!(o->backend = cli_gpu_backend()))
            BAD("--gpu: this strata was built without a GPU backend; `make cuda` builds build/cuda/strata");
    } else if (IS("--gpu-arena")) {   /* VRAM for the routed experts (build/cuda/strata --gpu) */
        VALUE();
        if (cli_parse_size(v, &o->gpu_arena_bytes) || !o->gpu_arena_bytes)
            BAD("--gpu-arena needs a size above 0 (K/M/G suffixes), got '%s'", v);
    } else if (IS("--host-cache")) {   /* host RAM under the GPU's expert arena (--gpu --gpu-arena) */
        VALUE();
        if (cli_parse_size(v, &o->host_cache_bytes) || !o->host_cache_bytes)
            BAD("--host-cache needs a size above 0 (K/M/G suffixes), got '%s'", v);
    } else if (IS("-ngl") || IS("--n-gpu-layers") || IS("--gpu-layers")) {   /* llama.cpp's spelling */
        INT(0, 1 << 20, n);
        if (n == 0) o->backend = NULL;
        else if (!(o->backend = cli_gpu_backend()))
            BAD("%s: this strata was built without a GPU backend; `make cuda` builds build/cuda/strata", a);
        else o->gpu_layers = (int)n;
    }
    else if (IS("--route")) {   /* routing policy (docs/ROUTING.md): checked now, used by engine_open */
        VALUE();
        err e;
        err_clear(&e);
        if (engine_route_spec_check(v, NULL, 0, &e)) BAD("--route: %s", e.msg);
        o->route_spec = v;
    }
    else return 0;
    return 1;
#undef IS
#undef VALUE
#undef INT
#undef BAD
}

int cli_stream_check(const char *cmd, const engine_opts *o)
{
    if (o->host_cache_bytes && o->stream)
        return cli_fail(cmd, CLI_USAGE, "--arena and --host-cache both size the expert store: give --arena SIZE on "
                        "the CPU, or --host-cache SIZE under the GPU's expert arena (--gpu --gpu-arena SIZE)");
    if (o->backend && o->stream)
        return cli_fail(cmd, CLI_USAGE, "--gpu does not stream through --arena: the host-RAM tier under the "
                        "GPU's expert arena is --host-cache SIZE (with --gpu-arena SIZE)");
    if (o->gpu_arena_bytes && !o->backend)
        return cli_fail(cmd, CLI_USAGE, "--gpu-arena sizes the GPU's expert arena: it needs --gpu (build/cuda/strata)");
    if (o->host_cache_bytes && !o->backend)
        return cli_fail(cmd, CLI_USAGE, "--host-cache is the host tier under the GPU's expert arena: it needs --gpu "
                        "(build/cuda/strata) and --gpu-arena SIZE");
    if (o->host_cache_bytes && !o->gpu_arena_bytes)
        return cli_fail(cmd, CLI_USAGE, "--host-cache is the host tier under the GPU's expert arena: it needs "
                        "--gpu-arena SIZE");
    /* the options of the expert store: the CPU's (--arena) or the host tier's (--host-cache) */
    const int store = o->stream || o->host_cache_bytes;
    if (!store && (o->evict || o->io_mode || o->io_threads || o->io_depth || o->no_direct || o->no_sidecar ||
                   o->sidecar_path || o->profile_path))
        return cli_fail(cmd, CLI_USAGE, "the expert streaming options need --arena SIZE|auto|0 (or --host-cache "
                        "SIZE with --gpu)");
    /* read-ahead: into the CPU's arena, or the GPU's (--gpu-arena) */
    const int gpu_tier = o->backend && o->gpu_arena_bytes;
    if (o->backend && !gpu_tier && (o->read_ahead || o->read_ahead_from))
        return cli_fail(cmd, CLI_USAGE, "--read-ahead with --gpu prefetches into the GPU's expert arena: it needs "
                        "--gpu-arena SIZE");
    if (!o->stream && !gpu_tier && (o->read_ahead || o->read_ahead_from))
        return cli_fail(cmd, CLI_USAGE, "the expert streaming options need --arena SIZE|auto|0 (or --host-cache "
                        "SIZE with --gpu)");
    if (gpu_tier && o->read_ahead_from == ENGINE_RA_INPUT)
        return cli_fail(cmd, CLI_USAGE, "--read-ahead-from input: the GPU's read-ahead runs the next layer's "
                        "router on this layer's post-attention residual (attn) only");
    return 0;
}

char *cli_read_file(const char *cmd, const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) { cli_fail(cmd, CLI_ERR, "cannot open %s: %s", path, strerror(errno)); return NULL; }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
        if (n == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb; cap *= 2;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) { free(buf); cli_fail(cmd, CLI_ERR, "cannot read %s", path); return NULL; }
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}
