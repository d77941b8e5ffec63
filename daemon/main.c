/* main: gpuswapd's command line: subcommand dispatch, version and help. */
#include <stdio.h>
#include <string.h>

#include "generate.h"

#define GPUSWAPD_VERSION "0.1.0"

static void usage(FILE *f)
{
    fputs("usage: gpuswapd COMMAND [options]\n"
          "commands:\n"
          "  generate   run a GGUF model once and print the continuation\n"
          "             (gpuswapd generate --help for its options)\n"
          "  version    print the version\n",
          f);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "generate") == 0)
        return gen_main(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("gpuswapd %s\n", GPUSWAPD_VERSION);
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "gpuswapd: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
