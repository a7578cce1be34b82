/* PLACEHOLDER: replaced by the module's owner. */
#include "cli.h"
int cmd_mkmodel(int argc, char **argv) { (void)argc; (void)argv; return cli_fail("mkmodel", CLI_ERR, "not built yet"); }
