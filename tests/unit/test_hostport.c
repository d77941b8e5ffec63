/* test_hostport: the host:port syntax the daemon's config and `gpuswap fleet` share: IPv4, DNS names (with '_'), bracketed IPv6, ports, and what is refused with which reason. */
#include <criterion/criterion.h>
#include <string.h>

#include "hostport.h"

static void accepts(const char *s, const char *host, unsigned port)
{
    char h[HOSTPORT_HOST_MAX], why[160] = "";
    unsigned p = 0;
    cr_assert_eq(hostport_check(s, why, sizeof why), HOSTPORT_OK, "%s: %s", s, why);
    cr_assert_eq(hostport_split(s, h, sizeof h, &p, why, sizeof why), HOSTPORT_OK, "%s: %s", s,
                 why);
    cr_assert_str_eq(h, host, "%s", s);
    cr_assert_eq(p, port, "%s", s);
}

/* s is refused, its reason containing want */
static void refuses(const char *s, const char *want)
{
    char why[160] = "";
    cr_assert_eq(hostport_check(s, why, sizeof why), HOSTPORT_ERR_INVALID, "%s accepted", s);
    cr_assert(strstr(why, want), "%s: '%s' has no '%s'", s, why, want);
}

Test(hostport, ipv4_addresses_are_accepted)
{
    accepts("127.0.0.1:8400", "127.0.0.1", 8400);
    accepts("0.0.0.0:1", "0.0.0.0", 1);
    accepts("10.0.0.11:65535", "10.0.0.11", 65535);
}

Test(hostport, dns_names_are_accepted_underscores_included)
{
    accepts("localhost:8400", "localhost", 8400);
    accepts("gpu-a.example.com:8400", "gpu-a.example.com", 8400);
    accepts("gpu_a.local:8400", "gpu_a.local", 8400);
    accepts("_svc.x-1.y:80", "_svc.x-1.y", 80);
    accepts("10.0.0.1a:80", "10.0.0.1a", 80); /* a letter makes it a name */
}

Test(hostport, ipv6_addresses_in_brackets_are_accepted_and_split_without_them)
{
    accepts("[::1]:8400", "::1", 8400);
    accepts("[::]:8080", "::", 8080);
    accepts("[fe80::1:2]:443", "fe80::1:2", 443);
    accepts("[::ffff:10.0.0.1]:80", "::ffff:10.0.0.1", 80);
}

Test(hostport, an_ipv6_address_without_brackets_is_refused_with_the_hint)
{
    refuses("::1:8400", "in brackets");
    refuses("fe80::1:80", "in brackets");
}

Test(hostport, what_is_between_brackets_must_be_an_ipv6_address)
{
    refuses("[localhost]:80", "not an IPv6 address");
    refuses("[]:80", "not an IPv6 address");
    refuses("[::1%eth0]:80", "not an IPv6 address");
    refuses("[::1]", "use host:port");
    refuses("[::1]8400", "use host:port");
    refuses("[::1:8400", "use host:port");
}

Test(hostport, a_host_of_digits_and_dots_must_be_a_dotted_quad)
{
    refuses("300.1.1.1:80", "not an IPv4 address");
    refuses("1.2.3:80", "not an IPv4 address");
    refuses("1.2.3.4.:80", "not an IPv4 address");
    refuses("8400:80", "not an IPv4 address");
}

Test(hostport, names_with_bad_labels_are_refused)
{
    static const char *const bad[] = {
        "-a:80", "a-:80",  "a-.b:80", "a..b:80", ".a:80",
        "a.:80", "a b:80", "a/b:80",  "a*:80",   "h\xc3\xa9:80",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        refuses(bad[i], "not a host name");
    char label[80];
    memset(label, 'a', 64);
    strcpy(label + 64, ":80");
    refuses(label, "not a host name"); /* a label of 64 bytes */
    label[63] = 0;
    accepts(strcat(label, ":80"), "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            80);
}

Test(hostport, a_name_of_254_bytes_is_refused_253_accepted)
{
    char s[300];
    size_t n = 0;
    while (n < 253) { /* 63-byte labels joined by dots, cut at 253 bytes */
        s[n] = (n % 64 == 63) ? '.' : 'a';
        n++;
    }
    s[n] = 0;
    char host[256];
    strcpy(host, s);
    strcat(s, ":1");
    accepts(s, host, 1);
    s[253] = 'a';
    strcpy(s + 254, ":1");
    refuses(s, "not a host name");
}

Test(hostport, ports_are_decimal_1_to_65535)
{
    refuses("localhost:0", "port must be 1..65535");
    refuses("localhost:65536", "port must be 1..65535");
    refuses("localhost:", "port must be 1..65535");
    refuses("localhost:+80", "port must be 1..65535");
    refuses("localhost:80 ", "port must be 1..65535");
    refuses("localhost:http", "port must be 1..65535");
    refuses("localhost:0x50", "port must be 1..65535");
    refuses("localhost:000080", "port must be 1..65535");
    accepts("localhost:08400", "localhost", 8400);
}

Test(hostport, an_empty_host_or_no_port_is_refused)
{
    refuses(":8400", "use host:port");
    refuses("8400", "use host:port");
    refuses("localhost", "use host:port");
    refuses("", "use host:port");
    refuses(NULL, "use host:port");
}

Test(hostport, split_refuses_a_host_buffer_too_small)
{
    char h[4], why[64];
    unsigned p;
    cr_assert_eq(hostport_split("localhost:80", h, sizeof h, &p, why, sizeof why),
                 HOSTPORT_ERR_INVALID);
    cr_assert_eq(hostport_split("abc:80", h, sizeof h, &p, why, sizeof why), HOSTPORT_OK);
    cr_assert_str_eq(h, "abc");
}
