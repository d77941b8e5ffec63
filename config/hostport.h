/* hostport: the one syntax of "host:port" addresses, checked and split alike by the daemon's config, its listeners and `gpuswap fleet`. */
#ifndef HOSTPORT_H
#define HOSTPORT_H

#include <stddef.h>

/*
 * host:port, where host is one of
 *   an IPv4 address   127.0.0.1, 0.0.0.0 (dotted quad; a host of digits and
 *                     dots is read as one, never as a name)
 *   a DNS name        localhost, gpu-a.example.com, gpu_a.local: labels of
 *                     letters, digits, '-' and '_', 1..63 bytes each, not
 *                     beginning or ending with '-', joined by single dots,
 *                     253 bytes at most. '_' is allowed because resolvers
 *                     (glibc's getaddrinfo, /etc/hosts, container DNS) take
 *                     names with it, though RFC 1123 host names have none
 *   an IPv6 address   in brackets: [::1], [::], [fe80::1] (no zone index)
 * and port is decimal, 1..65535. Nothing else: no empty host, no bare IPv6,
 * no port name.
 */

enum {
    HOSTPORT_OK = 0,
    HOSTPORT_ERR_INVALID = -1,
};

#define HOSTPORT_HOST_MAX 254 /* bytes of a host as hostport_split writes it, with its NUL */

/* HOSTPORT_OK when s (may be NULL) is host:port as above, else
 * HOSTPORT_ERR_INVALID with the reason in why (s itself not repeated). Pure. */
int hostport_check(const char *s, char *why, size_t whylen);

/* hostport_check, and on success the host without brackets into host (at
 * least HOSTPORT_HOST_MAX bytes: "::1" for "[::1]:8400") and the port into *port. */
int hostport_split(const char *s, char *host, size_t hostlen, unsigned *port, char *why,
                   size_t whylen);

#endif
