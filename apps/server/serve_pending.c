/* TRANSIENT stand-in until apps/server/server.c defines cmd_serve. */
#include "cli.h"
__attribute__((weak)) int cmd_serve(int argc, char **argv)
{ (void)argc; (void)argv; return cli_fail("serve", CLI_ERR, "not built yet"); }
