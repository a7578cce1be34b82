/* PLACEHOLDER: replaced by the module's owner. */
#include "cli.h"
int cmd_run(int argc, char **argv) { (void)argc; (void)argv; return cli_fail("run", CLI_ERR, "not built yet"); }
