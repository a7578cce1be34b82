/* PLACEHOLDER: replaced by the module's owner. */
#include "cli.h"
int cmd_chat(int argc, char **argv) { (void)argc; (void)argv; return cli_fail("chat", CLI_ERR, "not built yet"); }
