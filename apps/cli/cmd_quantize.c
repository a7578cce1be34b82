/* cmd_quantize: `strata quantize IN OUT TYPE [--pure] [--threads N]
 * [--allow-requantize] [--verbose]`, llama-quantize's job. Parses the
 * arguments and hands the work to strata_quantize() (quant/quantize_model.h);
 * prints the one-line summary. Exit codes: 0 ok, 1 the input could not be
 * read or converted / the output not written, 2 usage (unknown TYPE lists
 * the valid ones). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "quant/quantize_model.h"
#include "util/err.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: strata quantize IN OUT TYPE [--pure] [--threads N] [--allow-requantize] [--verbose]\n"
            "\n"
            "Quantize a GGUF model the way llama-quantize does (without an importance\n"
            "matrix): TYPE picks the base type and llama.cpp's per-tensor mix.\n"
            "\n"
            "  TYPE                %s\n"
            "                      (case-insensitive; Q3_K, Q4_K, Q5_K = the _M mixes)\n"
            "  --pure              every quantizable tensor gets the base type\n"
            "  -t, --threads N     worker threads (default: all CPUs)\n"
            "  --allow-requantize  accept already-quantized input tensors\n"
            "  -v, --verbose       one line per tensor on stderr\n"
            "  -h, --help          this help\n",
            quantize_type_names());
}

static double mib(uint64_t b) { return b / 1048576.0; }

int cmd_quantize(int argc, char **argv)
{
    const char *pos[3] = { NULL, NULL, NULL };
    int n_pos = 0, verbose = 0;
    quantize_result res;
    quantize_opts o = { .n_threads = 0, .progress = stderr, .result = &res };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return CLI_OK;
        } else if (!strcmp(a, "--pure")) {
            o.pure = 1;
        } else if (!strcmp(a, "--allow-requantize")) {
            o.allow_requantize = 1;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            verbose = 1;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            const char *v = cli_value("quantize", argc, argv, &i);
            long long n;
            if (!v) return CLI_USAGE;
            if (cli_parse_int(v, 1, 4096, &n) != 0)
                return cli_fail("quantize", CLI_USAGE, "--threads needs a whole number from 1 to 4096, got '%s'", v);
            o.n_threads = (int)n;
        } else if (a[0] == '-' && a[1] != '\0') {
            return cli_fail("quantize", CLI_USAGE, "unknown option '%s' (see strata quantize --help)", a);
        } else {
            if (n_pos == 3) return cli_fail("quantize", CLI_USAGE, "unexpected argument '%s' (usage: strata quantize IN OUT TYPE)", a);
            pos[n_pos++] = a;
        }
    }
    if (n_pos < 3)
        return cli_fail("quantize", CLI_USAGE, "need IN OUT TYPE (usage: strata quantize IN OUT TYPE [--pure] [--threads N])");
    o.in_path = pos[0];
    o.out_path = pos[1];
    o.type = pos[2];
    /* Check TYPE before touching any file: a typo is a usage error. */
    if (quantize_ftype_from_name(o.type) < 0)
        return cli_fail("quantize", CLI_USAGE, "unknown type '%s'; valid types: %s", o.type, quantize_type_names());
    if (verbose) o.log = stderr;

    err e;
    err_clear(&e);
    const int rc = strata_quantize(&o, &e);
    if (rc != 0) return cli_fail("quantize", rc == ERR_USAGE ? CLI_USAGE : CLI_ERR, "%s", e.msg);
    printf("strata quantize: wrote %s (%s): %lld tensors, %lld converted%s, %.2f MiB -> %.2f MiB (%.2f bpw) "
           "in %.2f s with %d thread%s\n",
           o.out_path, quantize_ftype_name((int)res.ftype), (long long)res.n_tensors, (long long)res.n_converted,
           res.n_fallback ? " (some with fallback types)" : "", mib(res.bytes_in), mib(res.bytes_out),
           res.n_elements ? res.bytes_out * 8.0 / (double)res.n_elements : 0.0, res.seconds, res.n_threads,
           res.n_threads == 1 ? "" : "s");
    return CLI_OK;
}
