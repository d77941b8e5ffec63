/* generate: the one-shot `gpuswapd generate` mode, for trying a model before it goes into a config. */
#ifndef GENERATE_H
#define GENERATE_H

/* argv[0] is "generate". Returns the process exit status (0 ok, 1 failure,
 * 2 usage error). */
int gen_main(int argc, char **argv);

#endif
