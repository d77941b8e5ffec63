/* preflight: before any model loads, checks the listeners the daemon will open (socket directories and paths, TCP ports), so a mistake is named at once. */
#ifndef PREFLIGHT_H
#define PREFLIGHT_H

#include <stddef.h>

#include "config.h"

/* Checks, as the daemon will open them: each unix socket's directory (exists, or is the runtime
 * directory c->rundir, created 0700 when create is set; searchable and writable by this user) and
 * path (free, or a stale socket); each TCP address (listen.tcp, listen.http, metrics.listen:
 * resolves, the port free and allowed to this user). Every problem is a line "KEY: reason" in out;
 * returns how many. (Model files are --check-config's and the loader's.) */
int preflight(const cfg_t *c, int create, char *out, size_t len);

#endif
