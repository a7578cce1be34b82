/* cli: the `strata` command's subcommands and shared argument helpers.
 * Exit codes: 0 success, 1 runtime error (bad file, I/O), 2 usage error
 * (unknown flag, missing or malformed argument). Errors are one line on
 * stderr: "strata <cmd>: <message>". */
#ifndef STRATA_CLI_H
#define STRATA_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"

enum { CLI_OK = 0, CLI_ERR = 1, CLI_USAGE = 2 };

int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
int cmd_repack(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_kld(int argc, char **argv);
int cmd_tfdump(int argc, char **argv);
int cmd_bench_ab(int argc, char **argv);
int cmd_taskeval(int argc, char **argv);
int cmd_serve(int argc, char **argv);

/* Shared by run and chat: gen_main (cmd_run.c) parses the generation flags,
 * loads the engine and either generates (run) or hands over to chat_loop
 * (cmd_chat.c). Both return a CLI exit code. */
struct engine;
struct session;
struct sampler;
int gen_main(const char *cmd, int argc, char **argv);
int chat_loop(struct engine *eng, struct session *s, struct sampler *sm, const char *tmpl_name,
              const char *system_prompt, int n_predict);

/* Print "strata <cmd>: <msg>" to stderr. Returns code. */
int cli_fail(const char *cmd, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Strict number parsing: the whole string must be a number in range.
 * Return 0 on success, -1 otherwise. */
int cli_parse_int(const char *s, long long lo, long long hi, long long *out);
int cli_parse_float(const char *s, double *out);
/* Sizes with K/M/G/T suffixes (binary, 1K = 1024); "auto" is not handled here. */
int cli_parse_size(const char *s, uint64_t *out);

/* Fetch the value of a flag at argv[*i] (advancing *i); NULL with a usage
 * message when it is missing. */
const char *cli_value(const char *cmd, int argc, char **argv, int *i);

/* The expert-streaming flags shared by run, chat, serve and the eval tools
 * (--arena --evict --io --io-threads --io-depth --read-ahead --read-ahead-from
 * --no-direct --sidecar --no-sidecar --profile), --gpu / -ngl N (the GPU
 * backend, cli_gpu_backend), --gpu-arena SIZE and --host-cache SIZE (the
 * GPU's expert arena and the host-RAM tier under it), and --route SPEC (the
 * routing policy, docs/ROUTING.md; it works without streaming and beats
 * STRATA_ROUTE; a bad spec is a usage error here), parsed into the engine's own
 * options. If argv[*i] is one, consume it (and its value, advancing *i) and
 * return 1; return 0 if it is not one; -1 after printing a one-line usage
 * error. */
int cli_stream_flag(const char *cmd, int argc, char **argv, int *i, engine_opts *o);
/* The GPU backend this program was built with (build/cuda/strata: CUDA;
 * apps/cli/cli_backend.c), or NULL (build/strata): what --gpu and -ngl N
 * (N > 0) select. */
const struct backend_iface *cli_gpu_backend(void);
/* Usage error (printed, returns CLI_USAGE) for flags that do not go
 * together: the expert store's options (--evict --io --io-threads --io-depth
 * --no-direct --sidecar --no-sidecar --profile) without --arena or
 * --host-cache; --read-ahead / --read-ahead-from without --arena or
 * --gpu --gpu-arena; --gpu-arena without --gpu; --host-cache without --gpu
 * and --gpu-arena; --gpu (or --host-cache) with --arena. 0 otherwise. */
int cli_stream_check(const char *cmd, const engine_opts *o);

/* Read a whole file into a NUL-terminated malloc'd buffer (caller frees).
 * NULL with a message on stderr on failure. */
char *cli_read_file(const char *cmd, const char *path, size_t *len);

#endif
