/* syscage: runs a command under the restrictions of gpuswapd's systemd unit that the kernel enforces on the process itself (W^X memory, the system-call filter), to try the CUDA tests as the service would run them (issue 18, item 5).
 *
 *   syscage [--unit FILE] [--groups FILE] [--allow CALL]... [--in-workers] [--no-mdwe] [--no-mdwe-seccomp] [--no-filter]
 *           [--verbose] -- CMD [ARG...]
 *   syscage --probe SYS WX      checks, unrestricted, that a filtered call (setuid) and W+X memory are
 *                               each 'denied' or 'allowed' (run it under syscage to see the restrictions)
 *
 * What it applies, in this order, then execvp(CMD):
 *  1. MemoryDenyWriteExecute=yes, two ways:
 *     - prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN) (Linux 6.3+; systemd 254+ uses it). A kernel
 *       without it makes this part print "syscage: skip: mdwe-prctl ..." and go on.
 *     - systemd 252's seccomp form (Debian 12's systemd, what the installed unit gets there): mmap
 *       with PROT_WRITE|PROT_EXEC, mprotect/pkey_mprotect adding PROT_EXEC and shmat with SHM_EXEC
 *       fail with EPERM.
 *  2. The unit's SystemCallFilter= lines, in order, with systemd's semantics: the first non-empty
 *     line sets the mode (a leading ~: deny list, everything else allowed; none: allow list, which
 *     starts from @default); later lines add to the list of that mode, or with the other prefix take
 *     away from it; an empty value resets. @groups are expanded recursively from the list that
 *     `systemd-analyze syscall-filter` of systemd 252 prints (tests/data/systemd-syscall-groups.txt;
 *     regenerate it with systemd-analyze syscall-filter | awk '/^@known/{s=1} /^@/ && !/^@known/{s=0}
 *     /^# (Ungrouped|Unlisted|Not showing)/{s=1} !s', below a three-line # header). Each name is
 *     resolved with libseccomp's seccomp_syscall_resolve_name for the native architecture; names
 *     this architecture lacks are skipped, as systemd skips them. A call outside the filter fails
 *     with SystemCallErrorNumber= (EPERM in our unit). Like systemd, the filter only knows the
 *     native architecture (SystemCallArchitectures=native) and sets no_new_privs (NoNewPrivileges=).
 * --in-workers: the restrictions are not applied to CMD but handed to it in GPUSWAPD_CAGE_BPF (the
 * compiled BPF programs, hex, and whether PR_SET_MDWE works here), for the unit tests: Criterion's
 * workers (boxfort) patch their own main() through a W+X page before a test runs, so MDWE must come
 * after that; tests/unit/cage.c applies them in each worker, before any test code.
 * --allow CALL lets one more call through, named on stderr: Criterion (boxfort) calls mincore, which
 * systemd 252 puts in no group, so the unit tests run with --allow mincore (the daemon does not call it;
 * a CUDA library that did would pass here and fail under the unit).
 * Restrictions that need a service manager (namespaces, devices, address families, users) are not
 * applied.
 */
#include <errno.h>
#include <seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <sys/prctl.h>
#include <sys/shm.h>
#include <sys/utsname.h>
#include <unistd.h>

#ifndef PR_SET_MDWE
#define PR_SET_MDWE 65
#endif
#ifndef PR_MDWE_REFUSE_EXEC_GAIN
#define PR_MDWE_REFUSE_EXEC_GAIN 1
#endif

#define MAX_GROUPS 64
#define MAX_DEPTH 8

/* ------------------------------------------------------------------ name lists */

typedef struct names {
    char **v; /* strdup'ed names: the list owns them */
    size_t n, cap;
} names_t;

static int names_find(const names_t *l, const char *s)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->v[i], s) == 0)
            return (int)i;
    return -1;
}

static int names_add(names_t *l, const char *s)
{
    if (names_find(l, s) >= 0)
        return 0;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        char **v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    if (!(l->v[l->n] = strdup(s)))
        return -1;
    l->n++;
    return 0;
}

static void names_del(names_t *l, const char *s)
{
    int i = names_find(l, s);
    if (i < 0)
        return;
    free(l->v[i]);
    l->v[i] = l->v[--l->n];
}

static void names_free(names_t *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* ------------------------------------------------------------------ systemd's groups */

typedef struct group {
    char name[64];   /* with its @ */
    names_t members; /* system calls and @subgroups */
} group_t;

typedef struct groups {
    group_t g[MAX_GROUPS];
    int n;
} groups_t;

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = 0;
    return s;
}

static int groups_read(groups_t *gs, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    char line[512];
    group_t *cur = NULL;
    int ln = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        ln++;
        int indented = line[0] == ' ' || line[0] == '\t';
        char *s = trim(line);
        if (!*s || *s == '#')
            continue;
        if (!indented) {
            if (*s != '@' || gs->n == MAX_GROUPS || strlen(s) >= sizeof cur->name) {
                snprintf(err, errlen, "%s:%d: expected a group name, got '%s'", path, ln, s);
                rc = -1;
                break;
            }
            cur = &gs->g[gs->n++];
            snprintf(cur->name, sizeof cur->name, "%s", s);
        } else if (!cur || names_add(&cur->members, s)) {
            snprintf(err, errlen, "%s:%d: a member outside a group, or out of memory", path, ln);
            rc = -1;
            break;
        }
    }
    fclose(f);
    if (rc == 0 && gs->n == 0) {
        snprintf(err, errlen, "%s: no groups", path);
        rc = -1;
    }
    return rc;
}

static void groups_free(groups_t *gs)
{
    for (int i = 0; i < gs->n; i++)
        names_free(&gs->g[i].members);
    gs->n = 0;
}

/* Adds (add = 1) or removes the system calls of NAME (a call or an @group) to/from OUT. */
static int groups_apply(const groups_t *gs, const char *name, int add, names_t *out, int depth,
                        char *err, size_t errlen)
{
    if (name[0] != '@') {
        if (add)
            return names_add(out, name);
        names_del(out, name);
        return 0;
    }
    const group_t *g = NULL;
    for (int i = 0; i < gs->n && !g; i++)
        if (strcmp(gs->g[i].name, name) == 0)
            g = &gs->g[i];
    if (!g || depth > MAX_DEPTH) {
        snprintf(err, errlen, "unknown system-call group %s (or nested too deep)", name);
        return -1;
    }
    for (size_t i = 0; i < g->members.n; i++)
        if (groups_apply(gs, g->members.v[i], add, out, depth + 1, err, errlen))
            return -1;
    return 0;
}

/* ------------------------------------------------------------------ the unit */

typedef struct unit {
    int filter_set; /* a SystemCallFilter= line with a value was seen (since the last reset) */
    int allow_list; /* 1: the list is what is allowed; 0: what is denied */
    names_t list;   /* system calls */
    int errno_nr;   /* SystemCallErrorNumber= (0: kill, systemd's default) */
    int mdwe;       /* MemoryDenyWriteExecute= */
    int n_filter_lines;
} unit_t;

static int errno_parse(const char *s)
{
    static const struct {
        const char *name;
        int nr;
    } tab[] = {{"EPERM", EPERM}, {"EACCES", EACCES}, {"ENOSYS", ENOSYS}, {"EINVAL", EINVAL}};
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (strcmp(s, tab[i].name) == 0)
            return tab[i].nr;
    char *end;
    long v = strtol(s, &end, 10);
    return *s && !*end && v > 0 && v < 4096 ? (int)v : -1;
}

static int yes(const char *v)
{
    return !strcmp(v, "yes") || !strcmp(v, "true") || !strcmp(v, "1") || !strcmp(v, "on");
}

static int unit_filter_line(unit_t *u, const groups_t *gs, char *v, char *err, size_t errlen)
{
    if (!*v) { /* an empty assignment resets the filter */
        names_free(&u->list);
        u->filter_set = 0;
        return 0;
    }
    int invert = *v == '~';
    if (invert)
        v++;
    if (!u->filter_set) {
        u->filter_set = 1;
        u->allow_list = !invert;
        if (u->allow_list && groups_apply(gs, "@default", 1, &u->list, 0, err, errlen))
            return -1;
    }
    int add = (!invert) == u->allow_list;
    char *save = NULL;
    for (char *w = strtok_r(v, " \t", &save); w; w = strtok_r(NULL, " \t", &save)) {
        if (strchr(w, ':')) {
            snprintf(err, errlen, "SystemCallFilter=%s: per-call error numbers are not supported",
                     w);
            return -1;
        }
        if (groups_apply(gs, w, add, &u->list, 0, err, errlen))
            return -1;
    }
    u->n_filter_lines++;
    return 0;
}

static int unit_read(unit_t *u, const groups_t *gs, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    char line[4096], sect[64] = "";
    int ln = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        ln++;
        char *s = trim(line);
        if (!*s || *s == '#' || *s == ';')
            continue;
        if (*s == '[') {
            snprintf(sect, sizeof sect, "%s", s);
            continue;
        }
        char *eq = strchr(s, '=');
        if (strcmp(sect, "[Service]") || !eq)
            continue;
        *eq = 0;
        char *k = trim(s), *v = trim(eq + 1);
        char e2[256] = "";
        if (!strcmp(k, "SystemCallFilter")) {
            rc = unit_filter_line(u, gs, v, e2, sizeof e2);
        } else if (!strcmp(k, "SystemCallErrorNumber")) {
            if ((u->errno_nr = errno_parse(v)) < 0) {
                snprintf(e2, sizeof e2, "unknown error number '%s'", v);
                rc = -1;
            }
        } else if (!strcmp(k, "MemoryDenyWriteExecute")) {
            u->mdwe = yes(v);
        } else if (!strcmp(k, "SystemCallArchitectures") && strcmp(v, "native")) {
            snprintf(e2, sizeof e2, "SystemCallArchitectures=%s: only 'native' is supported", v);
            rc = -1;
        }
        if (rc)
            snprintf(err, errlen, "%s:%d: %s", path, ln, e2);
    }
    fclose(f);
    return rc;
}

/* ------------------------------------------------------------------ applying */

/* --in-workers: the BPF programs, hex, ';'-separated, in the order they are to be loaded (malloc'ed,
 * handed to the environment). NULL: the filters are loaded here. */
static char *worker_bpf;
static int in_workers;

/* Loads CTX into this process, or with --in-workers appends its BPF program to worker_bpf. */
static int ctx_finish(scmp_filter_ctx ctx)
{
    if (!in_workers)
        return seccomp_load(ctx);
    int fd = memfd_create("syscage-bpf", 0);
    if (fd < 0)
        return -errno;
    int rc = seccomp_export_bpf(ctx, fd);
    off_t n = rc ? 0 : lseek(fd, 0, SEEK_END);
    unsigned char *b = n > 0 ? malloc((size_t)n) : NULL;
    size_t old = worker_bpf ? strlen(worker_bpf) : 0;
    char *h = b ? realloc(worker_bpf, old + 2 * (size_t)n + 2) : NULL;
    if (!rc && (!h || pread(fd, b, (size_t)n, 0) != n))
        rc = -ENOMEM;
    if (!rc) {
        worker_bpf = h;
        char *o = h + old;
        if (old)
            *o++ = ';';
        for (off_t i = 0; i < n; i++)
            o += sprintf(o, "%02x", b[i]);
    } else if (h) {
        worker_bpf = h;
    }
    free(b);
    close(fd);
    return rc;
}

/* systemd 252's MemoryDenyWriteExecute= filter (seccomp_memory_deny_write_execute), its own
 * filter stacked under the system-call filter. */
static int mdwe_seccomp_load(char *err, size_t errlen)
{
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (!ctx) {
        snprintf(err, errlen, "seccomp_init failed");
        return -1;
    }
    const uint64_t wx = PROT_WRITE | PROT_EXEC;
    int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(mmap), 1,
                              SCMP_A2(SCMP_CMP_MASKED_EQ, wx, wx));
    if (!rc)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(mprotect), 1,
                              SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC));
    if (!rc)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(pkey_mprotect), 1,
                              SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC));
    if (!rc)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(shmat), 1,
                              SCMP_A2(SCMP_CMP_MASKED_EQ, SHM_EXEC, SHM_EXEC));
    if (!rc)
        rc = ctx_finish(ctx);
    if (rc)
        snprintf(err, errlen, "the W^X filter: %s", strerror(-rc));
    seccomp_release(ctx);
    return rc ? -1 : 0;
}

static int filter_load(const unit_t *u, int verbose, char *err, size_t errlen)
{
    uint32_t deny = u->errno_nr ? SCMP_ACT_ERRNO((uint32_t)u->errno_nr) : SCMP_ACT_KILL_PROCESS;
    scmp_filter_ctx ctx = seccomp_init(u->allow_list ? deny : SCMP_ACT_ALLOW);
    if (!ctx) {
        snprintf(err, errlen, "seccomp_init failed");
        return -1;
    }
    int rc = 0, n_rules = 0, n_absent = 0;
    for (size_t i = 0; i < u->list.n && !rc; i++) {
        int nr = seccomp_syscall_resolve_name(u->list.v[i]);
        if (nr < 0) { /* __NR_SCMP_ERROR or a pseudo number: not a call of this architecture */
            n_absent++;
            if (verbose > 1)
                fprintf(stderr, "syscage: %s: not on this architecture, skipped\n", u->list.v[i]);
            continue;
        }
        rc = seccomp_rule_add(ctx, u->allow_list ? SCMP_ACT_ALLOW : deny, nr, 0);
        n_rules++;
    }
    if (!rc)
        rc = ctx_finish(ctx);
    if (rc)
        snprintf(err, errlen, "the system-call filter: %s", strerror(-rc));
    else if (verbose)
        fprintf(stderr,
                "syscage: system-call filter: %s list of %d calls (%d more names not on this "
                "architecture), others %s\n",
                u->allow_list ? "allow" : "deny", n_rules, n_absent,
                u->allow_list ? (u->errno_nr ? "fail with the unit's errno" : "kill") : "allowed");
    seccomp_release(ctx);
    return rc ? -1 : 0;
}

/* ------------------------------------------------------------------ probe */

/* The probes: a call in @privileged that succeeds for any user (setuid to one's own uid), and
 * memory that is writable and executable (an anonymous W+X mapping; W then +X by mprotect). */
static int probe(const char *want_sys, const char *want_wx)
{
    int bad = 0;
    int deny_sys = !strcmp(want_sys, "denied"), deny_wx = !strcmp(want_wx, "denied");
    if ((!deny_sys && strcmp(want_sys, "allowed")) || (!deny_wx && strcmp(want_wx, "allowed"))) {
        fprintf(stderr, "syscage: --probe wants 'denied' or 'allowed', twice\n");
        return 2;
    }
    errno = 0;
    int r = setuid(getuid());
    int e = errno;
    int denied = r != 0;
    printf("probe: setuid(getuid()) -> %s%s: %s\n", r ? "-1 " : "0", r ? strerrorname_np(e) : "",
           denied == deny_sys ? "as expected" : "NOT as expected");
    bad |= denied != deny_sys;

    errno = 0;
    void *p =
        mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    e = errno;
    denied = p == MAP_FAILED;
    printf("probe: mmap(PROT_WRITE|PROT_EXEC) -> %s: %s\n", denied ? strerrorname_np(e) : "mapped",
           denied == deny_wx ? "as expected" : "NOT as expected");
    bad |= denied != deny_wx;
    if (!denied)
        munmap(p, 4096);

    p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        printf("probe: mmap(PROT_READ|PROT_WRITE) failed: %s: NOT as expected\n", strerror(errno));
        return 1;
    }
    ((volatile char *)p)[0] = 1;
    errno = 0;
    r = mprotect(p, 4096, PROT_READ | PROT_EXEC);
    e = errno;
    denied = r != 0;
    printf("probe: mprotect(written page, PROT_READ|PROT_EXEC) -> %s: %s\n",
           denied ? strerrorname_np(e) : "0",
           denied == deny_wx ? "as expected" : "NOT as expected");
    bad |= denied != deny_wx;
    munmap(p, 4096);
    return bad;
}

/* ------------------------------------------------------------------ main */

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: syscage [--unit FILE] [--groups FILE] [--allow CALL]... [--in-workers] [--no-mdwe] [--no-mdwe-seccomp] [--no-filter] [-v] -- CMD [ARG...]\n"
        "       syscage --probe denied|allowed denied|allowed   (setuid, then W+X memory)\n"
        "Runs CMD under the unit's MemoryDenyWriteExecute= and SystemCallFilter=.\n");
}

int main(int argc, char **argv)
{
    const char *unit_path = "systemd/gpuswapd.service.in";
    const char *groups_path = "tests/data/systemd-syscall-groups.txt";
    int no_mdwe = 0, no_mdwe_seccomp = 0, no_filter = 0, verbose = 0, i;
    const char *extra[16]; /* --allow: calls the test harness needs beyond the unit's filter */
    int n_extra = 0;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            i++;
            break;
        } else if (!strcmp(a, "--probe") && i + 2 < argc) {
            return probe(argv[i + 1], argv[i + 2]);
        } else if (!strcmp(a, "--unit") && i + 1 < argc) {
            unit_path = argv[++i];
        } else if (!strcmp(a, "--allow") && i + 1 < argc && n_extra < 16) {
            extra[n_extra++] = argv[++i];
        } else if (!strcmp(a, "--groups") && i + 1 < argc) {
            groups_path = argv[++i];
        } else if (!strcmp(a, "--no-mdwe")) {
            no_mdwe = 1;
        } else if (!strcmp(a, "--in-workers")) {
            in_workers = 1;
        } else if (!strcmp(a, "--no-mdwe-seccomp")) {
            no_mdwe_seccomp = 1;
        } else if (!strcmp(a, "--no-filter")) {
            no_filter = 1;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            verbose++;
        } else if (!strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (i >= argc) {
        usage(stderr);
        return 2;
    }

    static groups_t gs;
    unit_t u = {0};
    char err[512] = "";
    int rc = 1;
    if (groups_read(&gs, groups_path, err, sizeof err) ||
        unit_read(&u, &gs, unit_path, err, sizeof err))
        goto fail;

    for (int k = 0; k < n_extra; k++) {
        if (!u.filter_set || seccomp_syscall_resolve_name(extra[k]) < 0) {
            snprintf(err, sizeof err, "--allow %s: %s", extra[k],
                     u.filter_set ? "not a system call of this architecture"
                                  : "the unit has no filter");
            goto fail;
        }
        if (u.allow_list ? names_add(&u.list, extra[k]) : (names_del(&u.list, extra[k]), 0)) {
            snprintf(err, sizeof err, "out of memory");
            goto fail;
        }
        fprintf(
            stderr,
            "syscage: %s allowed beyond the unit's filter (--allow: the test harness needs it)\n",
            extra[k]);
    }
    int mdwe_prctl = 0;
    if (u.mdwe && !no_mdwe && in_workers) { /* does the kernel have it? ask in a child */
        pid_t pid = fork();
        if (pid == 0)
            _exit(prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0L, 0L, 0L) == 0 ? 0
                  : errno == EINVAL                                             ? 1
                                                                                : 2);
        int st = 0;
        if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) == 2) {
            snprintf(err, sizeof err, "prctl(PR_SET_MDWE) in a child failed");
            goto fail;
        }
        mdwe_prctl = WEXITSTATUS(st) == 0;
        errno = EINVAL;
    }
    if (u.mdwe && !no_mdwe) {
        if (in_workers ? mdwe_prctl
                       : prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0L, 0L, 0L) == 0) {
            if (verbose)
                fprintf(stderr, "syscage: mdwe-prctl: PR_SET_MDWE(PR_MDWE_REFUSE_EXEC_GAIN) %s\n",
                        in_workers ? "for the workers" : "set");
        } else if (errno == EINVAL) {
            struct utsname un;
            uname(&un);
            fprintf(stderr,
                    "syscage: skip: mdwe-prctl: kernel %s has no PR_SET_MDWE (Linux 6.3+); "
                    "the seccomp form still applies\n",
                    un.release);
        } else {
            snprintf(err, sizeof err, "prctl(PR_SET_MDWE): %s", strerror(errno));
            goto fail;
        }
        if (!no_mdwe_seccomp && mdwe_seccomp_load(err, sizeof err))
            goto fail;
        if (verbose && !no_mdwe_seccomp)
            fprintf(stderr,
                    "syscage: mdwe-seccomp: W+X mmap, +X mprotect and SHM_EXEC fail with EPERM\n");
    } else if (verbose) {
        fprintf(stderr, "syscage: MemoryDenyWriteExecute not applied (%s)\n",
                no_mdwe ? "--no-mdwe" : "not set in the unit");
    }
    if (!no_filter && u.filter_set) {
        if (filter_load(&u, verbose, err, sizeof err))
            goto fail;
    } else if (verbose) {
        fprintf(stderr, "syscage: no system-call filter (%s)\n",
                no_filter ? "--no-filter" : "none in the unit");
    }
    names_free(&u.list);
    groups_free(&gs);
    if (in_workers) {
        /* read by tests/unit/cage.c in each Criterion worker: "mdwe=0|1;HEX;HEX..." */
        size_t n = 16 + (worker_bpf ? strlen(worker_bpf) : 0);
        char *v = malloc(n);
        if (!v) {
            fprintf(stderr, "syscage: out of memory\n");
            return 1;
        }
        snprintf(v, n, "mdwe=%d%s%s", mdwe_prctl, worker_bpf ? ";" : "",
                 worker_bpf ? worker_bpf : "");
        if (setenv("GPUSWAPD_CAGE_BPF", v, 1)) {
            fprintf(stderr, "syscage: setenv: %s\n", strerror(errno));
            return 1;
        }
        free(v);
        free(worker_bpf);
        if (verbose)
            fprintf(stderr,
                    "syscage: --in-workers: the restrictions above go to each test worker "
                    "(GPUSWAPD_CAGE_BPF, %zu bytes), not to the runner\n",
                    n);
    }
    execvp(argv[i], argv + i);
    fprintf(stderr, "syscage: %s: %s\n", argv[i], strerror(errno));
    return 127;

fail:
    fprintf(stderr, "syscage: %s\n", err);
    names_free(&u.list);
    groups_free(&gs);
    return rc;
}
