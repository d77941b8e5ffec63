/* hostport: the one syntax of "host:port" addresses, checked and split alike by the daemon's config, its listeners and `gpuswap fleet`. */
#include "hostport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#define HOSTPORT_NAME_MAX 253   /* bytes of a DNS name (RFC 1035, without the root dot) */
#define HOSTPORT_LABEL_MAX 63   /* bytes of one label */
#define HOSTPORT_V6_TEXT_MAX 46 /* INET6_ADDRSTRLEN */

static int fail(char *why, size_t whylen, const char *msg)
{
    if (why && whylen)
        snprintf(why, whylen, "%s", msg);
    return HOSTPORT_ERR_INVALID;
}

static int is_alnum(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* Whether the n bytes at s are a DNS name as hostport.h says. */
static int name_ok(const char *s, size_t n)
{
    if (n == 0 || n > HOSTPORT_NAME_MAX)
        return 0;
    size_t label = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '.') {
            if (label == 0 || s[i - 1] == '-')
                return 0;
            label = 0;
            continue;
        }
        if (!is_alnum(c) && c != '-' && c != '_')
            return 0;
        if (c == '-' && label == 0)
            return 0;
        if (++label > HOSTPORT_LABEL_MAX)
            return 0;
    }
    return label > 0 && s[n - 1] != '-';
}

/* The port at s (to the NUL): 1..65535 into *port, or -1. */
static int port_of(const char *s, unsigned *port)
{
    size_t n = strspn(s, "0123456789");
    if (n == 0 || n > 5 || s[n])
        return -1;
    unsigned long p = 0;
    for (size_t i = 0; i < n; i++)
        p = p * 10 + (unsigned long)(s[i] - '0');
    if (p < 1 || p > 65535)
        return -1;
    *port = (unsigned)p;
    return 0;
}

int hostport_split(const char *s, char *host, size_t hostlen, unsigned *port, char *why,
                   size_t whylen)
{
    static const char usage[] =
        "use host:port, e.g. 127.0.0.1:8400, gpu-a.example:8400 or [::1]:8400";
    if (!s || !*s)
        return fail(why, whylen, usage);
    const char *h = s, *colon;
    size_t hn;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':')
            return fail(why, whylen, usage);
        h = s + 1;
        hn = (size_t)(close - h);
        colon = close + 1;
        char v6[HOSTPORT_V6_TEXT_MAX];
        struct in6_addr a6;
        if (hn == 0 || hn >= sizeof v6)
            return fail(why, whylen, "not an IPv6 address between the brackets");
        memcpy(v6, h, hn);
        v6[hn] = 0;
        if (inet_pton(AF_INET6, v6, &a6) != 1)
            return fail(why, whylen, "not an IPv6 address between the brackets");
    } else {
        colon = strrchr(s, ':');
        if (!colon || colon == s)
            return fail(why, whylen, usage);
        hn = (size_t)(colon - s);
        if (memchr(s, ':', hn))
            return fail(why, whylen, "write an IPv6 address in brackets: [addr]:port");
        if (strspn(s, "0123456789.") == hn) {
            char v4[16];
            struct in_addr a4;
            if (hn >= sizeof v4)
                return fail(why, whylen, "not an IPv4 address (a host of digits and dots is one)");
            memcpy(v4, s, hn);
            v4[hn] = 0;
            if (inet_pton(AF_INET, v4, &a4) != 1)
                return fail(why, whylen, "not an IPv4 address (a host of digits and dots is one)");
        } else if (!name_ok(s, hn)) {
            return fail(why, whylen,
                        "not a host name: labels of letters, digits, '-' and '_' (1..63 bytes, "
                        "no '-' first or last) joined by dots");
        }
    }
    unsigned p;
    if (port_of(colon + 1, &p))
        return fail(why, whylen, "port must be 1..65535");
    if (host) {
        if (hn >= hostlen)
            return fail(why, whylen, "host too long");
        memcpy(host, h, hn);
        host[hn] = 0;
    }
    if (port)
        *port = p;
    return HOSTPORT_OK;
}

int hostport_check(const char *s, char *why, size_t whylen)
{
    return hostport_split(s, NULL, 0, NULL, why, whylen);
}
