/* test_cage: applies the restrictions that `syscage --in-workers` hands over (the systemd unit's W^X and system-call filter) in every Criterion worker before its test runs, and checks that they hold. */
#include <criterion/criterion.h>
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#ifndef PR_SET_MDWE
#define PR_SET_MDWE 65
#endif
#ifndef PR_MDWE_REFUSE_EXEC_GAIN
#define PR_MDWE_REFUSE_EXEC_GAIN 1
#endif

/* ------------------------------------------------------------------ the cage, in each worker */

static int cage_applied; /* 1: this worker runs under GPUSWAPD_CAGE_BPF's restrictions */
static int cage_mdwe;    /* 1: PR_SET_MDWE is set too */

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Loads one hex BPF program [s, s + n); 0 or -errno. */
static int cage_load(const char *s, size_t n)
{
    if (n == 0 || n % (2 * sizeof(struct sock_filter)))
        return -EINVAL;
    size_t bytes = n / 2;
    unsigned char *b = malloc(bytes);
    if (!b)
        return -ENOMEM;
    for (size_t i = 0; i < bytes; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            free(b);
            return -EINVAL;
        }
        b[i] = (unsigned char)(hi << 4 | lo);
    }
    struct sock_fprog prog = {.len = (unsigned short)(bytes / sizeof(struct sock_filter)),
                              .filter = (struct sock_filter *)(void *)b};
    int rc = prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0L, 0L) ? -errno : 0;
    free(b);
    return rc;
}

/* Runs before main in the runner and in every worker (boxfort starts workers as "boxfort-worker",
 * after patching their main); acts only in workers. A cage that cannot be applied ends the worker,
 * which Criterion reports as a crash: a test must not pass unrestricted when asked to run caged. */
__attribute__((constructor)) static void cage_apply(int argc, char **argv)
{
    const char *v = getenv("GPUSWAPD_CAGE_BPF");
    if (!v || argc < 1 || strcmp(argv[0], "boxfort-worker"))
        return;
    int rc = 0;
    if (!strncmp(v, "mdwe=1", 6)) {
        if (prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0L, 0L, 0L))
            rc = -errno;
        cage_mdwe = rc == 0;
    }
    if (!rc && prctl(PR_SET_NO_NEW_PRIVS, 1L, 0L, 0L, 0L))
        rc = -errno;
    for (const char *p = strchr(v, ';'); !rc && p; p = strchr(p + 1, ';')) {
        const char *end = strchr(p + 1, ';');
        rc = cage_load(p + 1, end ? (size_t)(end - p - 1) : strlen(p + 1));
    }
    if (rc) {
        fprintf(stderr, "test_cage: applying GPUSWAPD_CAGE_BPF failed: %s\n", strerror(-rc));
        _exit(70);
    }
    cage_applied = 1;
}

/* ------------------------------------------------------------------ tests */

/* Runs `BUILD/syscage ARGS -- BUILD/syscage --probe SYS WX` (the probe checks setuid and W+X memory
 * in the exec'ed, restricted process); its exit status, or -1 when syscage is not built. */
static int cage_probe(const char *args, const char *sys, const char *wx)
{
    char bin[512], cmd[1400];
    snprintf(bin, sizeof bin, "%s/syscage", tu_build_dir());
    if (access(bin, X_OK))
        return -1;
    /* LeakSanitizer stops the world with ptrace, which the filter refuses: no leak check in an
     * ASan build's caged probe (the later option wins) */
    const char *asan = getenv("ASAN_OPTIONS");
    snprintf(cmd, sizeof cmd, "ASAN_OPTIONS='%s:detect_leaks=0' '%s' %s -- '%s' --probe %s %s >&2",
             asan ? asan : "", bin, args, bin, sys, wx);
    int st = system(cmd);
    return st == -1 || !WIFEXITED(st) ? 999 : WEXITSTATUS(st);
}

#define NO_SYSCAGE "cage: build/syscage not built (libseccomp-dev not installed when it was built)"

Test(cage, a_call_outside_the_units_filter_fails_with_eperm)
{
    if (cage_applied) { /* this worker is caged: the real thing */
        errno = 0;
        cr_expect_eq(setuid(getuid()), -1, "setuid (in @privileged) succeeded in the cage");
        cr_expect_eq(errno, EPERM, "setuid: errno %d, not EPERM", errno);
        return;
    }
    int rc = cage_probe("--no-mdwe", "denied", "allowed");
    if (rc == -1)
        cr_skip_test(NO_SYSCAGE);
    cr_expect_eq(rc, 0, "under syscage, setuid was not denied (probe exit %d)", rc);
    rc = cage_probe("--no-mdwe --no-filter", "allowed", "allowed");
    cr_expect_eq(rc, 0, "without the filter, setuid was denied all the same (probe exit %d)", rc);
}

Test(cage, writable_and_executable_memory_is_refused)
{
    if (cage_applied) {
        void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
        cr_expect_eq(p, MAP_FAILED, "a W+X mapping was made in the cage");
        p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        cr_assert_neq(p, MAP_FAILED, "a plain RW mapping failed: %s", strerror(errno));
        ((volatile char *)p)[0] = 1;
        cr_expect_neq(mprotect(p, 4096, PROT_READ | PROT_EXEC), 0,
                      "a written page was made executable");
        munmap(p, 4096);
        return;
    }
    int rc = cage_probe("--no-filter --no-mdwe-seccomp --in-workers", "allowed", "allowed");
    if (rc == -1)
        cr_skip_test(NO_SYSCAGE);
    cr_expect_eq(rc, 0, "--in-workers restricted syscage's own command (probe exit %d)", rc);
    rc = cage_probe("--no-filter", "allowed", "denied"); /* systemd 252's seccomp form, and MDWE */
    cr_expect_eq(rc, 0, "under syscage, W+X memory was not refused (probe exit %d)", rc);
}

Test(cage, pr_set_mdwe_alone_refuses_writable_and_executable_memory)
{
    if (prctl(PR_SET_MDWE + 1, 0L, 0L, 0L, 0L) < 0 && errno == EINVAL)
        cr_skip_test(
            "cage: PR_SET_MDWE: the kernel lacks it (Linux 6.3+); the seccomp W^X filter still applies");
    if (cage_applied) {
        cr_expect(cage_mdwe, "the kernel has PR_SET_MDWE, yet the cage did not set it");
        cr_expect_eq(prctl(PR_SET_MDWE + 1, 0L, 0L, 0L, 0L) & PR_MDWE_REFUSE_EXEC_GAIN,
                     PR_MDWE_REFUSE_EXEC_GAIN,
                     "PR_GET_MDWE does not report PR_MDWE_REFUSE_EXEC_GAIN");
        return;
    }
    int rc = cage_probe("--no-filter --no-mdwe-seccomp", "allowed", "denied");
    if (rc == -1)
        cr_skip_test(NO_SYSCAGE);
    cr_expect_eq(rc, 0, "PR_SET_MDWE did not refuse W+X memory (probe exit %d)", rc);
}

Test(cage, ordinary_calls_still_work_in_the_cage)
{
    /* in a caged worker: files, threads' basics; elsewhere the same calls, trivially */
    char buf[512];
    const char *tmp = getenv("TMPDIR");
    snprintf(buf, sizeof buf, "%s/gsd-cage-XXXXXX", tmp ? tmp : "/tmp");
    int fd = mkstemp(buf);
    cr_assert_geq(fd, 0, "mkstemp: %s", strerror(errno));
    cr_expect_eq(write(fd, "x", 1), 1);
    void *p = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0);
    cr_expect_neq(p, MAP_FAILED, "mmap of a file, read-only: %s", strerror(errno));
    if (p != MAP_FAILED)
        munmap(p, 4096);
    close(fd);
    cr_expect_eq(unlink(buf), 0);
}
