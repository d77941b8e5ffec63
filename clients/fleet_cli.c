/* fleet_cli: `gpuswap fleet render|place`, the command line over fleet.c (load, place) and fleet_render.c. */
#include "fleet.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ CLI */

static const char fleet_usage[] =
    "usage: gpuswap fleet render FLEET.yaml --out DIR\n"
    "       gpuswap fleet place FLEET.yaml\n"
    "render writes, deterministically, under DIR: hosts/<host>/gpuswapd.yaml (the\n"
    "models placed on it), hosts/<host>/gpuswapd.service.d/fleet.conf (systemd drop-in\n"
    "allowing the proxy), haproxy.cfg (model-affinity routing), placement.txt and\n"
    "k8s/*.yaml (StatefulSet per node pool, headless Service, InferencePool and its\n"
    "endpoint picker). place prints the placement only. config/fleet/fleet.yaml\n"
    "documents the fleet file. Exit status: 0 ok, 1 invalid fleet or I/O error, 2 usage.\n";

int fleet_main(int argc, char **argv)
{
    const char *verb = argc > 1 ? argv[1] : NULL, *file = NULL, *out = NULL;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(fleet_usage, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strncmp(argv[i], "--out=", 6))
            out = argv[i] + 6;
        else if (argv[i][0] != '-' && !file)
            file = argv[i];
        else {
            fprintf(stderr, "gpuswap fleet: unexpected argument '%s'\n%s", argv[i], fleet_usage);
            return 2;
        }
    }
    if (verb && (!strcmp(verb, "--help") || !strcmp(verb, "-h") || !strcmp(verb, "help"))) {
        fputs(fleet_usage, stdout);
        return 0;
    }
    int render = verb && !strcmp(verb, "render"), place_only = verb && !strcmp(verb, "place");
    if ((!render && !place_only) || !file || (render && !out) || (place_only && out)) {
        fputs(fleet_usage, stderr);
        return 2;
    }
    char err[1024];
    fleet_t *f = NULL;
    if (fleet_load_file(file, &f, err, sizeof err)) {
        fprintf(stderr, "gpuswap fleet: %s\n", err);
        return 1;
    }
    int rc = 0;
    if (render) {
        rc = fleet_render(f, out, err, sizeof err);
        if (!rc)
            printf("rendered %zu hosts, %zu models into %s\n", f->n_hosts, f->n_models, out);
    } else {
        unsigned char *place = calloc(f->n_models * f->n_hosts, 1);
        rc = place ? fleet_place(f, place, err, sizeof err) : FLEET_ERR_NOMEM;
        for (size_t m = 0; !rc && m < f->n_models; m++) {
            printf("%s:", f->models[m].name);
            for (size_t h = 0; h < f->n_hosts; h++)
                if (place[m * f->n_hosts + h])
                    printf(" %s", f->hosts[h].name);
            printf("\n");
        }
        free(place);
        if (rc == FLEET_ERR_NOMEM)
            snprintf(err, sizeof err, "out of memory");
    }
    if (rc)
        fprintf(stderr, "gpuswap fleet: %s\n", err);
    fleet_free(f);
    return rc ? 1 : 0;
}
