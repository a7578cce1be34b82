/* cmd_tokenize: `strata tokenize`, llama-tokenize's twin.
 *
 *   strata tokenize -m MODEL (-p TEXT | -f FILE | --stdin) [--ids] [--no-bos]
 *                   [--no-parse-special] [--no-escape] [--show-count]
 *
 * Loads only the GGUF header and the tokenizer (never the weights). Output
 * is llama-tokenize's: with --ids one line "[id, id, ...]", otherwise one
 * line per token "%6d -> 'piece'" (pieces rendered with special tokens
 * shown). As llama-tokenize does, the prompt's escapes (\n \r \t \' \" \\
 * \xHH) are processed unless --no-escape, parse_special is on unless
 * --no-parse-special, and BOS follows the model's add_bos flag unless
 * --no-bos. Tokenizer warnings go to stderr; stdout carries only tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

static const char *k_cmd = "tokenize";

static void usage(FILE *out)
{
    fprintf(out,
            "usage: strata tokenize -m MODEL (-p TEXT | -f FILE | --stdin) [options]\n"
            "\n"
            "Tokenize a prompt with a GGUF model's tokenizer, as llama-tokenize does.\n"
            "\n"
            "  -m, --model FILE        GGUF file (only its header and tokenizer are read)\n"
            "  -p, --prompt TEXT       text to tokenize\n"
            "  -f, --file FILE         read the text from a file\n"
            "      --stdin             read the text from standard input\n"
            "      --ids               print only the ids, as [1, 2, 3]\n"
            "      --no-bos            do not add BOS (or EOS) even if the model asks for it\n"
            "      --no-parse-special  do not recognise control tokens in the text\n"
            "      --no-escape         do not process escapes (\\n, \\t, \\xHH, ...) in the text\n"
            "      --show-count        print the number of tokens at the end\n"
            "      --log-disable       accepted for llama-tokenize compatibility (no effect)\n");
}

/* llama.cpp's string_process_escapes, in place; returns the new length. */
static size_t process_escapes(char *s, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\' && i + 1 < n) {
            char c = s[++i];
            switch (c) {
            case 'n': s[o++] = '\n'; break;
            case 'r': s[o++] = '\r'; break;
            case 't': s[o++] = '\t'; break;
            case '\'': s[o++] = '\''; break;
            case '"': s[o++] = '"'; break;
            case '\\': s[o++] = '\\'; break;
            case 'x':
                if (i + 2 < n) {
                    char x[3] = { s[i + 1], s[i + 2], 0 };
                    char *end = NULL;
                    long v = strtol(x, &end, 16);
                    if (end == x + 2) {
                        i += 2;
                        s[o++] = (char)v;
                        break;
                    }
                }
                /* fall through */
            default:
                s[o++] = '\\';
                s[o++] = c;
                break;
            }
        } else {
            s[o++] = s[i];
        }
    }
    return o;
}

static char *read_stdin(size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (got == 0) break;
        if (n == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
    }
    if (!buf || ferror(stdin)) { free(buf); return NULL; }
    buf[n] = '\0';
    *len = n;
    return buf;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *model = NULL, *prompt = NULL, *file = NULL;
    int ids_only = 0, no_bos = 0, no_parse_special = 0, no_escape = 0, show_count = 0, use_stdin = 0;
    int n_sources = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return CLI_OK; }
        else if (!strcmp(a, "--ids")) ids_only = 1;
        else if (!strcmp(a, "--no-bos")) no_bos = 1;
        else if (!strcmp(a, "--no-parse-special")) no_parse_special = 1;
        else if (!strcmp(a, "--no-escape")) no_escape = 1;
        else if (!strcmp(a, "--show-count")) show_count = 1;
        else if (!strcmp(a, "--log-disable")) { /* nothing is logged anyway */ }
        else if (!strcmp(a, "--stdin")) { use_stdin = 1; n_sources++; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(model = cli_value(k_cmd, argc, argv, &i))) return CLI_USAGE;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(prompt = cli_value(k_cmd, argc, argv, &i))) return CLI_USAGE;
            n_sources++;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(file = cli_value(k_cmd, argc, argv, &i))) return CLI_USAGE;
            n_sources++;
        } else {
            return cli_fail(k_cmd, CLI_USAGE, "unknown option '%s' (see strata tokenize --help)", a);
        }
    }
    if (!model) return cli_fail(k_cmd, CLI_USAGE, "a model is required (-m FILE)");
    if (n_sources == 0) return cli_fail(k_cmd, CLI_USAGE, "a prompt source is required (-p TEXT, -f FILE or --stdin)");
    if (n_sources > 1) return cli_fail(k_cmd, CLI_USAGE, "-p, -f and --stdin are mutually exclusive");

    char *text = NULL;
    size_t len = 0;
    if (prompt) {
        len = strlen(prompt);
        text = malloc(len + 1);
        if (!text) return cli_fail(k_cmd, CLI_ERR, "out of memory");
        memcpy(text, prompt, len + 1);
    } else if (file) {
        if (!(text = cli_read_file(k_cmd, file, &len))) return CLI_ERR;
    } else if (use_stdin) {
        if (!(text = read_stdin(&len))) return cli_fail(k_cmd, CLI_ERR, "cannot read standard input");
    }
    if (!no_escape) len = process_escapes(text, len);

    err e = { 0 };
    gguf_file *g = NULL;
    tokenizer *t = NULL;
    if (gguf_open(&g, model, &e) || tokenizer_open(&t, g, &e)) {
        gguf_close(g);
        free(text);
        return cli_fail(k_cmd, CLI_ERR, "%s", e.msg);
    }
    gguf_close(g);
    if (tokenizer_warning(t)[0]) fprintf(stderr, "strata tokenize: warning: %s\n", tokenizer_warning(t));

    size_t cap = len + 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    int rc = ids ? tokenizer_encode(t, text, len, !no_bos, !no_parse_special, ids, cap, &n, &e) : ERR_NOMEM;
    if (rc == ERR_RANGE) {   /* rare: invalid UTF-8 or SPM byte fallback can exceed one token per byte */
        free(ids);
        cap = n;
        ids = malloc(cap * sizeof *ids);
        err_clear(&e);
        rc = ids ? tokenizer_encode(t, text, len, !no_bos, !no_parse_special, ids, cap, &n, &e) : ERR_NOMEM;
    }
    free(text);
    if (rc) {
        free(ids);
        tokenizer_close(t);
        return cli_fail(k_cmd, CLI_ERR, "%s", rc == ERR_NOMEM && !e.msg[0] ? "out of memory" : e.msg);
    }

    if (ids_only) {
        fputc('[', stdout);
        for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
        fputs("]\n", stdout);
    } else {
        char small[256];
        for (size_t i = 0; i < n; i++) {
            int pl = tokenizer_piece(t, ids[i], 1, small, sizeof small);
            printf("%6d -> '", ids[i]);
            if (pl > (int)sizeof small) {
                char *big = malloc((size_t)pl);
                if (big) {
                    tokenizer_piece(t, ids[i], 1, big, (size_t)pl);
                    fwrite(big, 1, (size_t)pl, stdout);
                    free(big);
                }
            } else if (pl > 0) {
                fwrite(small, 1, (size_t)pl, stdout);
            }
            fputs("'\n", stdout);
        }
    }
    if (show_count) printf("Total number of tokens: %zu\n", n);
    free(ids);
    tokenizer_close(t);
    if (fflush(stdout) != 0) return cli_fail(k_cmd, CLI_ERR, "cannot write the output");
    return CLI_OK;
}
