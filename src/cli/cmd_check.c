#include <stdio.h>
#include "cli/cli.h"
int cmd_check(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "g4 check: not built yet\n");
    return 1;
}
