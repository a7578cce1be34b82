/* PLACEHOLDER: replaced by the module's owner. */
#include "cli.h"
int cmd_tokenize(int argc, char **argv) { (void)argc; (void)argv; return cli_fail("tokenize", CLI_ERR, "not built yet"); }
