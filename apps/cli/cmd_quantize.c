/* PLACEHOLDER: replaced by the module's owner. */
#include "cli.h"
int cmd_quantize(int argc, char **argv) { (void)argc; (void)argv; return cli_fail("quantize", CLI_ERR, "not built yet"); }
