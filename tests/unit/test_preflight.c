/* test_preflight: the listener checks before any model loads: socket directories (missing, not writable, the runtime directory made), socket paths (in use, not a socket, stale), ports in use. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "config.h"
#include "front/preflight.h"

static cfg_t *load(const char *yaml)
{
    cfg_t *c = NULL;
    char err[512] = "";
    cr_assert_eq(cfg_load_string(yaml, "t.yaml", &c, err, sizeof err), 0, "%s", err);
    return c;
}

static char *tmp_dir(void)
{
    char *d = NULL;
    cr_assert_geq(asprintf(&d, "%s/gsd-pre-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp"),
                  0);
    cr_assert_not_null(mkdtemp(d));
    return d;
}

Test(preflight, a_missing_socket_directory_and_a_non_socket_path_are_named)
{
    char *d = tmp_dir(), yaml[1024], out[2048];
    snprintf(
        yaml, sizeof yaml,
        "listen:\n  socket: %s/none/s.sock\nadmin:\n  socket: %s/file\nmodels:\n  - name: a\n    path: /m.gguf\n",
        d, d);
    char file[600];
    snprintf(file, sizeof file, "%s/file", d);
    FILE *f = fopen(file, "w");
    cr_assert_not_null(f);
    fclose(f);
    cfg_t *c = load(yaml);
    cr_assert_eq(preflight(c, 1, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "listen.socket: the socket's directory ") &&
                  strstr(out, "/none: No such file"),
              "%s", out);
    cr_assert(strstr(out, "admin.socket: ") && strstr(out, "exists and is not a socket"), "%s",
              out);
    cfg_free(c);
    unlink(file);
    rmdir(d);
    free(d);
}

Test(preflight, a_socket_in_use_is_named_and_a_stale_one_is_not)
{
    char *d = tmp_dir(), yaml[1024], out[2048];
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s/s.sock", d);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(listen(fd, 1), 0);
    snprintf(
        yaml, sizeof yaml,
        "listen:\n  socket: %s\nadmin:\n  socket: ~\nmodels:\n  - name: a\n    path: /m.gguf\n",
        sa.sun_path);
    cfg_t *c = load(yaml);
    cr_assert_eq(preflight(c, 0, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "is in use by a running process"), "%s", out);
    close(fd); /* the file stays: a stale socket, which the daemon replaces */
    cr_assert_eq(preflight(c, 0, out, sizeof out), 0, "%s", out);
    cfg_free(c);
    unlink(sa.sun_path);
    rmdir(d);
    free(d);
}

Test(preflight, a_port_in_use_is_named_with_the_key)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(listen(fd, 1), 0);
    socklen_t len = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &len);
    char yaml[512], out[2048];
    snprintf(
        yaml, sizeof yaml,
        "listen:\n  socket: ~\n  tcp: 127.0.0.1:%d\n  http: \"[::1]:%d\"\nadmin:\n  socket: ~\nmodels:\n  - name: a\n    path: /m.gguf\n",
        ntohs(sa.sin_port), ntohs(sa.sin_port));
    cfg_t *c = load(yaml);
    int n = preflight(c, 0, out, sizeof out);
    cr_assert_geq(n, 1, "%s", out);
    cr_assert(strstr(out, "listen.tcp: 127.0.0.1:") && strstr(out, "Address already in use"), "%s",
              out);
    cfg_free(c);
    close(fd);
}

Test(preflight, the_runtime_directory_is_made_only_when_asked)
{
    char *d = tmp_dir(), yaml[512], out[2048], run[600];
    int root = geteuid() == 0;
    if (root) {
        /* as root the runtime directory is /run/gpuswapd: the test runs with nobody's effective
         * ids, as the daemon of an ordinary user, and takes root's back to clean up */
        cr_assert_eq(chown(d, 65534, 65534), 0);
        cr_assert_eq(setresgid((gid_t)-1, 65534, (gid_t)-1), 0);
        cr_assert_eq(setresuid((uid_t)-1, 65534, (uid_t)-1), 0);
    }
    setenv("XDG_RUNTIME_DIR", d, 1);
    snprintf(yaml, sizeof yaml, "listen:\n  http: ~\nmodels:\n  - name: a\n    path: /m.gguf\n");
    cfg_t *c = load(yaml);
    snprintf(run, sizeof run, "%s/gpuswapd", d);
    cr_assert_str_eq(c->rundir, run);
    cr_assert_str_eq(c->admin.socket, strcat(strcpy((char[700]){0}, run), "/admin.sock"));
    struct stat st;
    cr_assert_eq(preflight(c, 0, out, sizeof out), 0, "%s", out);
    cr_assert_neq(stat(run, &st), 0, "a check makes nothing");
    cr_assert_eq(preflight(c, 1, out, sizeof out), 0, "%s", out);
    cr_assert_eq(stat(run, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0700);
    cfg_free(c);
    cr_assert_eq(rmdir(run), 0);
    if (root) {
        cr_assert_eq(setresuid((uid_t)-1, 0, (uid_t)-1), 0);
        cr_assert_eq(setresgid((gid_t)-1, 0, (gid_t)-1), 0);
    }
    cr_assert_eq(rmdir(d), 0);
    free(d);
}
