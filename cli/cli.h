/* cli.h -- the `lupin` command line (cli/): serve and check (main.c),
 * explain (explain_cli.c), test (test.c). */
#ifndef LUPIN_CLI_H
#define LUPIN_CLI_H

#include "gateway.h"

/* `lupin explain` (explain_cli.c): returns the exit code. */
int gw_explain_main(int argc, char **argv);
extern const char gw_explain_usage[];

/* `lupin epp` (epp_cli.c): the gateway as an endpoint picker. */
extern const char gw_epp_usage[];
int gw_epp_main(int argc, char **argv);

/* `lupin test` (cli/test.c): runs busted on plugin specs. */
extern const char gw_test_usage[];
int gw_test_main(int argc, char **argv);

#endif
