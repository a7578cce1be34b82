/* TRANSIENT: weak stand-ins for subcommands whose files are being written in
 * this session; each real definition overrides its stand-in. Removed before
 * the session ends. */
#include "cli.h"
#define PENDING(fn, name) \
    __attribute__((weak)) int fn(int argc, char **argv) \
    { (void)argc; (void)argv; return cli_fail(name, CLI_ERR, "not built yet"); }
PENDING(cmd_perplexity, "perplexity")
PENDING(cmd_kld, "kld")
PENDING(cmd_tfdump, "tfdump")
PENDING(cmd_bench_ab, "bench-ab")
PENDING(cmd_taskeval, "taskeval")
