/* beinfo: opens a backend and prints what it is (name, description, page and pool size), where cuBLAS would come from, and why CUDA is unusable when it is: gpu-check's environment stage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"

int main(int argc, char **argv)
{
    const char *kind = argc > 1 ? argv[1] : "cuda";
    size_t mib = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : 256;
    if (argc > 3 || (argc > 1 && !strcmp(argv[1], "--help"))) {
        fprintf(stderr, "usage: %s [BACKEND] [POOL_MIB]   (default: cuda 256)\n", argv[0]);
        return 2;
    }
    char why[1024] = "", err[512] = "";
    int n = be_cuda_status(why, sizeof why);
    printf("cuda_devices: %d\n", n);
    printf("cuda_status: %s\n", why);
    char blas[1536] = "";
    be_cuda_cublas(blas, sizeof blas);
    printf("cublas: %s\n", blas);
    be_kind_t k;
    if (be_kind_from_name(kind, &k)) {
        fprintf(stderr, "%s: unknown backend '%s' (auto, cpu, sim, cuda)\n", argv[0], kind);
        return 2;
    }
    be_params_t p = {.kind = k, .memory = mib << 20};
    backend_t *be = be_open(&p, err, sizeof err);
    if (!be) {
        printf("backend: %s: not opened: %s\n", kind, err);
        return 1;
    }
    printf("backend: %s\n", be->name);
    printf("desc: %s\n", be->desc ? be->desc : "(none)");
    printf("page_kib: %zu\n", be->page_size >> 10);
    printf("pool_mib: %zu\n", be->pool_bytes >> 20);
    be_close(be);
    return 0;
}
