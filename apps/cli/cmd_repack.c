/* cmd_repack: `strata repack MODEL [-o PATH]`, write the expert sidecar
 * (one 4096-aligned gate|up|down blob per layer-expert; format in
 * src/expert/sidecar.h) next to the GGUF. Flag parsing and the summary
 * line only; the work is sidecar_write(). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "expert/sidecar.h"

int cmd_repack(int argc, char **argv);

static void usage(FILE *f)
{
    fprintf(f,
        "usage: strata repack MODEL [-o PATH]\n"
        "\n"
        "Write the expert sidecar of a MoE GGUF: one blob per layer-expert (gate|up|down\n"
        "together), each aligned to 4096 bytes, so that streaming reads each expert with\n"
        "one O_DIRECT read. strata finds MODEL" SIDECAR_SUFFIX " by itself; rerun repack\n"
        "whenever MODEL changes (a stale sidecar is refused).\n"
        "\n"
        "  -o, --output PATH    sidecar path (default: MODEL" SIDECAR_SUFFIX ")\n"
        "  -q, --quiet          no progress bar, no summary\n");
}

int cmd_repack(int argc, char **argv)
{
    sidecar_write_opts o = { 0 };
    int quiet = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return CLI_OK; }
        if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) { quiet = 1; continue; }
        if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (!(o.out_path = cli_value("repack", argc, argv, &i))) return CLI_USAGE;
        } else if (a[0] == '-' && a[1] != '\0') {
            usage(stderr);
            return cli_fail("repack", CLI_USAGE, "unknown option '%s'", a);
        } else if (o.model_path) {
            return cli_fail("repack", CLI_USAGE, "one MODEL only (got '%s' and '%s')", o.model_path, a);
        } else {
            o.model_path = a;
        }
    }
    if (!o.model_path) { usage(stderr); return cli_fail("repack", CLI_USAGE, "no MODEL given"); }
    o.progress = quiet ? NULL : stderr;

    sidecar_write_stats st;
    err e;
    err_clear(&e);
    int rc = sidecar_write(&o, &st, &e);
    if (rc) return cli_fail("repack", rc == ERR_USAGE ? CLI_USAGE : CLI_ERR, "%s", e.msg);
    if (!quiet) {
        const double s = st.seconds > 0 ? st.seconds : 1e-9;
        printf("repack: %llu blobs (%d layers x %d experts), %.1f MB of experts -> '%s' (%.1f MB) in %.2f s "
               "(%.2f GB/s)\n", (unsigned long long)st.n_blobs, st.n_layer, st.n_expert, (double)st.bytes_read / 1e6,
               st.out_path, (double)st.file_bytes / 1e6, st.seconds, (double)st.bytes_read / 1e9 / s);
    }
    return CLI_OK;
}
