/* cuda_blas: cuBLAS for the cuda backend's prefill GEMMs: located (GPUSWAPD_CUBLAS, the loader's path, the CUDA install, pip's nvidia/<pkg>/lib folders), dlopen'ed, checked, its handle made; without it the backend runs its own kernels. */
#include <dlfcn.h>
#include <glob.h>
#include <link.h>
#include <unistd.h>

#include "cuda_int.cuh"

/* ------------------------------------------------------------------ location */

#define CUBLAS_MAJOR (CUDART_VERSION / 1000)
/* RTLD_NODELETE: the cuBLAS libraries carry their own C++ runtime state and
 * are not unloaded by dlclose (LeakSanitizer can then still name them). */
#define BLAS_DLOPEN (RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)

static void blas_unload(cu_blas_t *b)
{
    if (b->lib)
        dlclose(b->lib);
    if (b->lt)
        dlclose(b->lt);
    b->lib = b->lt = NULL;
}

/* Loads one candidate file (a path, or a bare name for the loader's own
 * search) and checks it: every symbol used, the major version this build's
 * runtime goes with. 0 when usable; otherwise why not in note. */
static int blas_try(cu_blas_t *b, const char *file, char *note, size_t notelen)
{
    const char *slash = strrchr(file, '/');
    if (slash) {
        /* libcublas needs libcublasLt; the toolkit's copy may carry no
         * RUNPATH to find it beside itself, so it is loaded first */
        char lt[600];
        snprintf(lt, sizeof lt, "%.*s/libcublasLt.so.%d", (int)(slash - file), file, CUBLAS_MAJOR);
        if (access(lt, R_OK) == 0)
            b->lt = dlopen(lt, BLAS_DLOPEN);
    }
    b->lib = dlopen(file, BLAS_DLOPEN);
    if (!b->lib) {
        const char *e = dlerror();
        snprintf(note, notelen, "%s", e ? e : "dlopen failed");
        blas_unload(b);
        return -1;
    }
    b->create = (pfn_cublas_create)dlsym(b->lib, "cublasCreate_v2");
    b->destroy = (pfn_cublas_destroy)dlsym(b->lib, "cublasDestroy_v2");
    b->set_stream = (pfn_cublas_set_stream)dlsym(b->lib, "cublasSetStream_v2");
    b->set_math_mode = (pfn_cublas_set_math_mode)dlsym(b->lib, "cublasSetMathMode");
    b->gemm_ex = (pfn_cublas_gemm_ex)dlsym(b->lib, "cublasGemmEx");
    b->get_property = (pfn_cublas_get_property)dlsym(b->lib, "cublasGetProperty");
    if (!b->create || !b->destroy || !b->set_stream || !b->gemm_ex || !b->get_property) {
        snprintf(note, notelen, "%s lacks cublasCreate_v2/cublasGemmEx/cublasGetProperty", file);
        blas_unload(b);
        return -1;
    }
    if (b->get_property(MAJOR_VERSION, &b->ver[0]) != CUBLAS_STATUS_SUCCESS ||
        b->get_property(MINOR_VERSION, &b->ver[1]) != CUBLAS_STATUS_SUCCESS ||
        b->get_property(PATCH_LEVEL, &b->ver[2]) != CUBLAS_STATUS_SUCCESS) {
        snprintf(note, notelen, "%s: cublasGetProperty failed", file);
        blas_unload(b);
        return -1;
    }
    if (b->ver[0] != CUBLAS_MAJOR) {
        snprintf(note, notelen, "%s is cuBLAS %d.%d, this build needs %d.x", file, b->ver[0],
                 b->ver[1], CUBLAS_MAJOR);
        blas_unload(b);
        return -1;
    }
    struct link_map *lm = NULL;
    if (dlinfo(b->lib, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
        snprintf(b->path, sizeof b->path, "%s", lm->l_name);
    else
        snprintf(b->path, sizeof b->path, "%s", file);
    return 0;
}

/* Tries the files matching a glob pattern in order; 0 once one loads. */
static int blas_try_glob(cu_blas_t *b, const char *pattern, char *note, size_t notelen)
{
    glob_t g;
    memset(&g, 0, sizeof g);
    int rc = -1;
    if (glob(pattern, 0, NULL, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc && rc; i++)
            rc = blas_try(b, g.gl_pathv[i], note, notelen);
    globfree(&g);
    return rc;
}

/* Finds cuBLAS: GPUSWAPD_CUBLAS (a file, or "none" for the own kernels), the
 * loader's search (LD_LIBRARY_PATH, the ldconfig cache, system folders), the
 * CUDA install ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda*), then pip's
 * nvidia/<pkg>/lib folders under the usual site-packages. 0 with b->lib set,
 * 0 with b->lib NULL and the reason in b->note (own kernels), or -1 with err
 * when GPUSWAPD_CUBLAS names a file that cannot be used. */
int cuda_blas_locate(cu_blas_t *b, char *err, size_t errlen)
{
    char name[64], note[512] = "", pat[1024];
    snprintf(name, sizeof name, "libcublas.so.%d", CUBLAS_MAJOR);
    const char *env = getenv("GPUSWAPD_CUBLAS");
    if (env && *env) {
        if (!strcmp(env, "none") || !strcmp(env, "off") || !strcmp(env, "0")) {
            snprintf(b->note, sizeof b->note, "disabled by GPUSWAPD_CUBLAS=%s", env);
            return 0;
        }
        if (blas_try(b, env, note, sizeof note)) {
            snprintf(err, errlen, "cuda backend: GPUSWAPD_CUBLAS=%s cannot be used: %s", env, note);
            return -1;
        }
        return 0;
    }
    char first[512] = ""; /* the first reason a file that exists was refused */
#define BLAS_TRY(call)                                                                             \
    do {                                                                                           \
        note[0] = 0;                                                                               \
        if ((call) == 0)                                                                           \
            return 0;                                                                              \
        if (!first[0] && note[0] &&                                                                \
            ((!strstr(note, "No such file") && !strstr(note, "cannot open shared object")) ||      \
             strstr(note, "libcublasLt")))                                                         \
            snprintf(first, sizeof first, "%s", note);                                             \
    } while (0)
    BLAS_TRY(blas_try(b, name, note, sizeof note));
    const char *homes[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
    for (size_t i = 0; i < sizeof homes / sizeof homes[0]; i++) {
        if (!homes[i] || !*homes[i])
            continue;
        snprintf(pat, sizeof pat, "%s/lib64/%s", homes[i], name);
        BLAS_TRY(blas_try_glob(b, pat, note, sizeof note));
        snprintf(pat, sizeof pat, "%s/targets/*/lib/%s", homes[i], name);
        BLAS_TRY(blas_try_glob(b, pat, note, sizeof note));
    }
    snprintf(pat, sizeof pat, "/usr/local/cuda-%d*/lib64/%s", CUBLAS_MAJOR, name);
    BLAS_TRY(blas_try_glob(b, pat, note, sizeof note));
    /* pip wheels: nvidia/cublas/lib (CUDA 12 layout) or nvidia/cu13/lib */
    const char *prefixes[] = {
        getenv("VIRTUAL_ENV"), getenv("CONDA_PREFIX"), getenv("HOME"), "/usr/local", "/usr",
        "/opt/conda"};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        if (!prefixes[i] || !*prefixes[i])
            continue;
        const char *mid = i == 2 ? "/.local/lib" : "/lib";
        snprintf(pat, sizeof pat, "%s%s/python3*/site-packages/nvidia/*/lib/%s", prefixes[i], mid,
                 name);
        BLAS_TRY(blas_try_glob(b, pat, note, sizeof note));
        snprintf(pat, sizeof pat, "%s%s/python3*/dist-packages/nvidia/*/lib/%s", prefixes[i], mid,
                 name);
        BLAS_TRY(blas_try_glob(b, pat, note, sizeof note));
    }
    snprintf(pat, sizeof pat, "/usr/lib/python3/dist-packages/nvidia/*/lib/%s", name);
    BLAS_TRY(blas_try_glob(b, pat, note, sizeof note));
#undef BLAS_TRY
    if (first[0])
        snprintf(b->note, sizeof b->note, "no usable %s (%s)", name, first);
    else
        snprintf(b->note, sizeof b->note,
                 "%s not found in the loader path, the CUDA install or pip nvidia/*/lib folders",
                 name);
    return 0;
}

/* The handle on the compute stream; on failure cuBLAS is dropped (own
 * kernels) with the reason in b->note. */
void cuda_blas_start(cu_blas_t *b, cudaStream_t stream)
{
    if (!b->lib)
        return;
    if (b->create(&b->h) != CUBLAS_STATUS_SUCCESS) {
        b->h = NULL;
        snprintf(b->note, sizeof b->note, "cublasCreate failed with %s", b->path);
    } else if (b->set_stream(b->h, stream) != CUBLAS_STATUS_SUCCESS ||
               (b->set_math_mode &&
                b->set_math_mode(b->h, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS)) {
        b->destroy(b->h);
        b->h = NULL;
        snprintf(b->note, sizeof b->note, "cannot configure the cuBLAS handle of %s", b->path);
    }
    if (!b->h)
        blas_unload(b);
}

extern "C" int be_cuda_cublas_find(char *what, size_t whatlen)
{
    cu_blas_t b;
    memset(&b, 0, sizeof b);
    char err[1200] = "";
    if (cuda_blas_locate(&b, err, sizeof err)) {
        snprintf(what, whatlen, "%s", err);
        return BE_ERR_ARG;
    }
    int found = b.lib != NULL;
    if (found)
        snprintf(what, whatlen, "cuBLAS %d.%d.%d (%s)", b.ver[0], b.ver[1], b.ver[2], b.path);
    else
        snprintf(what, whatlen, "none: %s", b.note);
    blas_unload(&b);
    return found;
}

void cuda_blas_close(cu_blas_t *b)
{
    if (b->h)
        b->destroy(b->h);
    blas_unload(b);
}
