/* cmd_inspect: `strata inspect MODEL [--no-tensors] [--max-array N]`.
 * Parses the flags and hands the work to strata_inspect() (model/inspect.h).
 * Exit codes: 0 ok, 1 the file could not be read or parsed, 2 usage. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "model/inspect.h"
#include "util/err.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: strata inspect MODEL [--no-tensors] [--max-array N]\n"
            "\n"
            "Print a GGUF file's facts, metadata, tensors and MoE summary.\n"
            "Only the header is read.\n"
            "\n"
            "  -m, --model MODEL  the GGUF file (or give it as the argument)\n"
            "  --no-tensors       skip the tensor list\n"
            "  --max-array N      array elements shown per key (default 8)\n"
            "  -h, --help         this help\n");
}

int cmd_inspect(int argc, char **argv)
{
    const char *model = NULL;
    inspect_opts o = { .no_tensors = 0, .max_array = 0 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return CLI_OK;
        } else if (!strcmp(a, "--no-tensors")) {
            o.no_tensors = 1;
        } else if (!strcmp(a, "--max-array")) {
            const char *v = cli_value("inspect", argc, argv, &i);
            long long n;
            if (!v) return CLI_USAGE;
            if (cli_parse_int(v, 1, 1000000000, &n) != 0)
                return cli_fail("inspect", CLI_USAGE, "--max-array needs a whole number from 1 to 1000000000, got '%s'", v);
            o.max_array = (int)n;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            const char *v = cli_value("inspect", argc, argv, &i);
            if (!v) return CLI_USAGE;
            if (model) return cli_fail("inspect", CLI_USAGE, "more than one model given ('%s' and '%s')", model, v);
            model = v;
        } else if (a[0] == '-' && a[1] != '\0') {
            return cli_fail("inspect", CLI_USAGE, "unknown option '%s' (see strata inspect --help)", a);
        } else {
            if (model) return cli_fail("inspect", CLI_USAGE, "more than one model given ('%s' and '%s')", model, a);
            model = a;
        }
    }
    if (!model) return cli_fail("inspect", CLI_USAGE, "no model given (usage: strata inspect MODEL [--no-tensors] [--max-array N])");
    err e;
    err_clear(&e);
    if (strata_inspect(model, stdout, &o, &e) != 0) return cli_fail("inspect", CLI_ERR, "%s", e.msg);
    return CLI_OK;
}
