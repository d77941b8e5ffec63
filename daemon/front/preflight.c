/* preflight: before any model loads, checks the listeners the daemon will open (socket directories and paths, TCP ports), so a mistake is named at once. */
#include "preflight.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "server.h"

typedef struct out {
    char *buf;
    size_t len, used;
    int n;
} out_t;

static void problem(out_t *o, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void problem(out_t *o, const char *key, const char *fmt, ...)
{
    o->n++;
    if (!o->len || o->used + 1 >= o->len)
        return;
    int k = snprintf(o->buf + o->used, o->len - o->used, "%s: ", key);
    if (k > 0 && o->used + (size_t)k < o->len) {
        o->used += (size_t)k;
        va_list ap;
        va_start(ap, fmt);
        k = vsnprintf(o->buf + o->used, o->len - o->used, fmt, ap);
        va_end(ap);
        if (k > 0)
            o->used = o->used + (size_t)k < o->len ? o->used + (size_t)k : o->len - 1;
    }
    if (o->used + 1 < o->len) {
        o->buf[o->used++] = '\n';
        o->buf[o->used] = 0;
    }
}

/* Whether systemd passed a listening socket for path (socket activation: nothing to check), or
 * with path NULL any inet one (the server takes it as listen.tcp). */
static int passed_by_systemd(const char *path)
{
    int n = sd_listen_fds(0);
    for (int i = 0; i < n; i++) {
        int fd = SD_LISTEN_FDS_START + i;
        if (path ? sd_is_socket_unix(fd, SOCK_STREAM, 1, path, 0) > 0
                 : sd_is_socket_inet(fd, AF_UNSPEC, SOCK_STREAM, 1, 0) > 0)
            return 1;
    }
    return 0;
}

/* The socket's directory: there (or the runtime directory, created when create), a directory this
 * user may search and write; then the path itself free to bind. */
static void check_socket(out_t *o, const cfg_t *c, const char *key, const char *path, int create)
{
    if (!path || passed_by_systemd(path))
        return;
    char dir[PATH_MAX], err[512];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    struct stat st;
    if (stat(dir, &st) != 0 && errno == ENOENT && c->rundir && !strcmp(dir, c->rundir)) {
        if (!create)
            return; /* the daemon creates it at start */
        if (mkdir(dir, geteuid() == 0 ? 0755 : 0700) != 0 && errno != EEXIST) {
            problem(o, key, "cannot create the runtime directory %s: %s", dir, strerror(errno));
            return;
        }
    }
    if (stat(dir, &st) != 0) {
        problem(o, key, "the socket's directory %s: %s%s", dir, strerror(errno),
                errno == ENOENT
                    ? " (create it, or run under systemd, whose unit makes "
                      "/run/gpuswapd; or leave the key out to use the runtime directory)"
                    : "");
        return;
    }
    if (!S_ISDIR(st.st_mode)) {
        problem(o, key, "%s is not a directory", dir);
        return;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        problem(o, key, "cannot create %s: no write permission in %s (uid %u)", path, dir,
                (unsigned)geteuid());
        return;
    }
    if (srv_path_check(path, err, sizeof err) < 0)
        problem(o, key, "%s", err);
}

static void check_tcp(out_t *o, const char *key, const char *hostport)
{
    char err[512];
    if (hostport && srv_tcp_check(hostport, err, sizeof err))
        problem(o, key, "%s", err);
}

int preflight(const cfg_t *c, int create, char *buf, size_t len)
{
    out_t o = {.buf = buf, .len = len};
    if (len)
        buf[0] = 0;
    check_socket(&o, c, "listen.socket", c->listen.socket, create);
    check_socket(&o, c, "admin.socket", c->admin.socket, create);
    if (c->listen.socket && c->admin.socket && !strcmp(c->listen.socket, c->admin.socket))
        problem(&o, "admin.socket", "the same path as listen.socket");
    if (!passed_by_systemd(NULL))
        check_tcp(&o, "listen.tcp", c->listen.tcp);
    check_tcp(&o, "listen.http", c->listen.http);
    if (!c->listen.http || !c->metrics.listen || strcmp(c->listen.http, c->metrics.listen))
        check_tcp(&o, "metrics.listen", c->metrics.listen);
    return o.n;
}
