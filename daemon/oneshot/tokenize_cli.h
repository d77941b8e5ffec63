/* tokenize_cli: the one-shot `gpuswapd tokenize` mode, text on stdin to token ids on stdout. */
#ifndef TOKENIZE_CLI_H
#define TOKENIZE_CLI_H

/* argv[0] is "tokenize". Returns the process exit status (0 ok, 1 failure,
 * 2 usage error). */
int tokenize_cli_main(int argc, char **argv);

#endif
