/* PLACEHOLDER: replaced by the module's owner. */
#include "cli.h"
int cmd_inspect(int argc, char **argv) { (void)argc; (void)argv; return cli_fail("inspect", CLI_ERR, "not built yet"); }
