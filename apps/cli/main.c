/* strata: the command-line front end. One binary, one subcommand per job.
 * Each subcommand lives in apps/cli/cmd_<name>.c and uses only the public
 * headers (engine.h and the tool headers; see `make check-includes`). */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int cmd_bench(int argc, char **argv);   /* cmd_bench.c */

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} command;

static const command k_commands[] = {
    { "run",      cmd_run,      "generate text from a prompt (-m MODEL -p PROMPT -n N)" },
    { "chat",     cmd_chat,     "interactive chat with the model's chat template" },
    { "serve",    cmd_serve,    "OpenAI-compatible HTTP server (chat, completions, models, health, metrics)" },
    { "inspect",  cmd_inspect,  "print a GGUF file's metadata, tensors and MoE summary" },
    { "tokenize", cmd_tokenize, "tokenize text with a model's tokenizer (--ids)" },
    { "quantize", cmd_quantize, "quantize a GGUF model (IN OUT TYPE), like llama-quantize" },
    { "repack",   cmd_repack,   "write the expert sidecar (one aligned blob per layer-expert) next to a GGUF" },
    { "profile",  cmd_profile,  "rank layer-experts by use on a corpus, for the arena's warm fill" },
    { "perplexity", cmd_perplexity, "llama-perplexity's chunked perplexity and KL-divergence (base files interchangeable)" },
    { "tfdump",   cmd_tfdump,   "teacher-forced logit dump of a corpus's evaluation positions" },
    { "kld",      cmd_kld,      "compare two teacher-forced dumps: PPL, KL(ref||cand), top-1, per position" },
    { "bench",    cmd_bench,    "prompt and generation speed in the manner of llama-bench (ppN, tgN)" },
    { "bench-ab", cmd_bench_ab, "paired A/B benchmark of two strata run configurations" },
    { "taskeval", cmd_taskeval, "tool-call task evaluation of greedy generations" },
    { "mkmodel",  cmd_mkmodel,  "generate a synthetic qwen3moe GGUF (presets tiny, small, 30b-a3b, 80b-a3b)" },
};

static void usage(FILE *out)
{
    fprintf(out, "usage: strata <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        fprintf(out, "  %-11s %s\n", k_commands[i].name, k_commands[i].help);
    fprintf(out, "\n'strata <command> --help' describes a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) { usage(stderr); return CLI_USAGE; }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return CLI_OK;
    }
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        if (!strcmp(argv[1], k_commands[i].name)) return k_commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "strata: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return CLI_USAGE;
}
