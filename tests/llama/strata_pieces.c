/* strata_pieces: strata's side of the detokenization check. Every id's
 * piece, through the same tokenizer_piece() that `strata tokenize` (listing,
 * special tokens shown) and `strata run` (special tokens hidden) print, in
 * the format of `llama_oracle pieces`:
 *
 *   strata_pieces VOCAB.gguf OUT
 *   per id: "ID<TAB>hex(special shown)<TAB>hex(hidden)<TAB>is_eog\n"
 *
 * Exit 0 ok, 1 on any error. */
#include <stdio.h>
#include <stdlib.h>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

static void hex(FILE *f, const char *p, int n)
{
    for (int i = 0; i < n; i++) fprintf(f, "%02x", (unsigned char)p[i]);
}

int main(int argc, char **argv)
{
    if (argc != 3) { fprintf(stderr, "usage: strata_pieces VOCAB.gguf OUT\n"); return 1; }
    err e = { 0 };
    gguf_file *g = NULL;
    tokenizer *t = NULL;
    if (gguf_open(&g, argv[1], &e) || tokenizer_open(&t, g, &e)) {
        fprintf(stderr, "strata_pieces: %s\n", e.msg);
        gguf_close(g);
        return 1;
    }
    FILE *f = fopen(argv[2], "w");
    if (!f) { tokenizer_close(t); gguf_close(g); return 1; }
    char buf[4096];
    const int32_t nv = tokenizer_n_vocab(t);
    for (int32_t id = 0; id < nv; id++) {
        fprintf(f, "%d\t", id);
        int n = tokenizer_piece(t, id, 1, buf, sizeof buf);
        hex(f, buf, n < 0 ? 0 : n > (int)sizeof buf ? (int)sizeof buf : n);
        fputc('\t', f);
        n = tokenizer_piece(t, id, 0, buf, sizeof buf);
        hex(f, buf, n < 0 ? 0 : n > (int)sizeof buf ? (int)sizeof buf : n);
        fprintf(f, "\t%d\n", tokenizer_is_eog(t, id) ? 1 : 0);
    }
    int rc = fclose(f) ? 1 : 0;
    tokenizer_close(t);
    gguf_close(g);
    return rc;
}
