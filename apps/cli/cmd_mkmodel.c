/* cmd_mkmodel: `strata mkmodel`, write a deterministic synthetic qwen3moe
 * GGUF (presets tiny, small, 30b-a3b, 80b-a3b; every shape field and type
 * can be overridden). Flag parsing only; the work is strata_mkmodel(). */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "mkmodel/mkmodel.h"
#include "quant/qtype.h"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: strata mkmodel -o PATH [options]\n"
        "\n"
        "Write a synthetic qwen3moe GGUF with random weights and a real BPE vocabulary\n"
        "(learned from a bundled text). Same options and seed => identical bytes.\n"
        "\n"
        "  -o, --output PATH    output file (required)\n"
        "  --preset NAME        tiny (default: 2 layers, 8 experts, f32, <1 MB), small (8 layers,\n"
        "                       128 experts, ~230 MB), 30b-a3b (Qwen3-30B-A3B shape, ~17 GB),\n"
        "                       80b-a3b (Qwen3-Next-80B-A3B MoE shape, ~44 GB)\n"
        "  --seed N             random seed (default 0)\n"
        "  --layers N --experts N --experts-used N --embd N --ff-exp N\n"
        "  --heads N --heads-kv N --head-dim N --vocab N --ctx N\n"
        "                       override one shape field of the preset\n"
        "  --type T             type of every weight matrix except the router: f32, f16, bf16,\n"
        "                       q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K\n"
        "  --type-experts T --type-attn T --type-embd T --type-output T --type-router T\n"
        "                       type of one group (norms are always f32)\n"
        "  --ftype F            every matrix in the type `llama-quantize MODEL OUT F` would give it:\n"
        "                       F one of strata quantize's types (Q4_K_M, Q5_K_M, Q3_K_L, Q8_0, ...;\n"
        "                       Q4_K_M: q4_K, attn_v and ffn_down_exps q6_K in half the layers)\n"
        "  --tied               no output.weight: the head reuses token_embd\n"
        "  --route-skew S       Zipf exponent of expert popularity (default 0 = none)\n"
        "  -t, --threads N      generation threads (default: all CPUs)\n"
        "  -q, --quiet          no report, no progress bar\n");
}

static int int_flag(const char *flag, const char *v, long long lo, long long hi, int *out)
{
    long long x;
    if (cli_parse_int(v, lo, hi, &x))
        return cli_fail("mkmodel", CLI_USAGE, "%s needs an integer in [%lld, %lld], got '%s'", flag, lo, hi, v);
    *out = (int)x;
    return 0;
}

static int type_flag(const char *flag, const char *v, const char **out)
{
    if (qtype_from_name(v) < 0)
        return cli_fail("mkmodel", CLI_USAGE, "%s: unknown type '%s' (f32, f16, bf16, q8_0, q4_0, q4_1, "
                        "q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K)", flag, v);
    *out = v;
    return 0;
}

int cmd_mkmodel(int argc, char **argv)
{
    mkmodel_opts o = { .preset = "tiny" };
    int quiet = 0;
    static const struct { const char *flag; size_t off; long long hi; } k_ints[] = {
        { "--layers",       offsetof(mkmodel_opts, n_layer),       4096 },
        { "--experts",      offsetof(mkmodel_opts, n_expert),      65536 },
        { "--experts-used", offsetof(mkmodel_opts, n_expert_used), 65536 },
        { "--embd",         offsetof(mkmodel_opts, n_embd),        65536 },
        { "--ff-exp",       offsetof(mkmodel_opts, n_ff_exp),      262144 },
        { "--heads",        offsetof(mkmodel_opts, n_head),        1024 },
        { "--heads-kv",     offsetof(mkmodel_opts, n_head_kv),     1024 },
        { "--head-dim",     offsetof(mkmodel_opts, head_dim),      4096 },
        { "--vocab",        offsetof(mkmodel_opts, n_vocab),       1 << 22 },
        { "--ctx",          offsetof(mkmodel_opts, n_ctx),         1 << 24 },
    };
    static const struct { const char *flag; size_t off; } k_types[] = {
        { "--type",         offsetof(mkmodel_opts, type) },
        { "--type-experts", offsetof(mkmodel_opts, type_experts) },
        { "--type-attn",    offsetof(mkmodel_opts, type_attn) },
        { "--type-embd",    offsetof(mkmodel_opts, type_embd) },
        { "--type-output",  offsetof(mkmodel_opts, type_output) },
        { "--type-router",  offsetof(mkmodel_opts, type_router) },
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return CLI_OK; }
        if (!strcmp(a, "--tied")) { o.tied = 1; continue; }
        if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) { quiet = 1; continue; }
        int handled = 0;
        for (size_t k = 0; k < sizeof k_ints / sizeof k_ints[0] && !handled; k++) {
            if (strcmp(a, k_ints[k].flag)) continue;
            const char *v = cli_value("mkmodel", argc, argv, &i);
            if (!v || int_flag(a, v, 1, k_ints[k].hi, (int *)((char *)&o + k_ints[k].off))) return CLI_USAGE;
            handled = 1;
        }
        for (size_t k = 0; k < sizeof k_types / sizeof k_types[0] && !handled; k++) {
            if (strcmp(a, k_types[k].flag)) continue;
            const char *v = cli_value("mkmodel", argc, argv, &i);
            if (!v || type_flag(a, v, (const char **)((char *)&o + k_types[k].off))) return CLI_USAGE;
            handled = 1;
        }
        if (handled) continue;
        if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (!(o.path = cli_value("mkmodel", argc, argv, &i))) return CLI_USAGE;
        } else if (!strcmp(a, "--ftype")) {
            if (!(o.ftype = cli_value("mkmodel", argc, argv, &i))) return CLI_USAGE;
        } else if (!strcmp(a, "--preset")) {
            if (!(o.preset = cli_value("mkmodel", argc, argv, &i))) return CLI_USAGE;
        } else if (!strcmp(a, "--seed")) {
            const char *v = cli_value("mkmodel", argc, argv, &i);
            long long s;
            if (!v) return CLI_USAGE;
            if (cli_parse_int(v, 0, (long long)(~0ull >> 1), &s))
                return cli_fail("mkmodel", CLI_USAGE, "--seed needs a non-negative integer, got '%s'", v);
            o.seed = (uint64_t)s;
        } else if (!strcmp(a, "--route-skew")) {
            const char *v = cli_value("mkmodel", argc, argv, &i);
            double s;
            if (!v) return CLI_USAGE;
            if (cli_parse_float(v, &s) || s < 0 || s > 8)
                return cli_fail("mkmodel", CLI_USAGE, "--route-skew needs a number in [0, 8], got '%s'", v);
            o.route_skew = s;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            const char *v = cli_value("mkmodel", argc, argv, &i);
            if (!v || int_flag(a, v, 1, 1024, &o.n_threads)) return CLI_USAGE;
        } else {
            cli_fail("mkmodel", CLI_USAGE, "unknown option '%s'", a);
            usage(stderr);
            return CLI_USAGE;
        }
    }
    if (!o.path) {
        cli_fail("mkmodel", CLI_USAGE, "no output file (-o PATH)");
        usage(stderr);
        return CLI_USAGE;
    }
    o.progress = !quiet;   /* drawn only when stderr is a TTY */
    err e = {0};
    int rc = strata_mkmodel(&o, quiet ? NULL : stdout, &e);
    if (rc) return cli_fail("mkmodel", rc == ERR_USAGE ? CLI_USAGE : CLI_ERR, "%s", e.msg);
    return CLI_OK;
}
