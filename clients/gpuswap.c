/* gpuswap: the command-line client of gpuswapd, speaking the JSON-line sockets of proto/PROTOCOL.md:
 * its options, help, the command table and main; the commands are gpuswap_gen.c's and
 * gpuswap_admin.c's, the plumbing gpuswap_io.c's (gpuswap_int.h says how they stack). */
#include "gpuswap_int.h"

#include "fleet.h"
#include "proto.h"

#include "base/num.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GS_DEFAULT_SOCKET "/run/gpuswapd/gpuswapd.sock"
#define GS_DEFAULT_ADMIN "/run/gpuswapd/admin.sock"

/* ------------------------------------------------------------------ options */

enum gs_key {
    K_HELP,
    K_SOCKET,
    K_ADMIN,
    K_JSON,
    K_MODEL,
    K_MAX_TOKENS,
    K_SEED,
    K_STOP,
    K_VERBOSE,
    K_SYSTEM,
    K_WATCH,
    K_INTERVAL,
    K_COUNT,
    K_API_KEY,
    K_DEADLINE,
    K_NO_RETRY,
    K_CLASS,
    K_SAMPLER, /* K_SAMPLER + i: sampling parameter i of sampler_params.h */
};

typedef struct gs_optdef {
    const char *lng; /* --long */
    char shrt;       /* -s, or 0 */
    int has_arg;
    unsigned set; /* S_* */
    enum gs_key key;
} gs_optdef_t;

static const gs_optdef_t gs_optdefs[] = {
    {"help", 'h', 0, S_GLOBAL, K_HELP},
    {"socket", 0, 1, S_GLOBAL, K_SOCKET},
    {"admin-socket", 0, 1, S_GLOBAL, K_ADMIN},
    {"json", 0, 0, S_GLOBAL, K_JSON},
    {"api-key", 0, 1, S_GLOBAL, K_API_KEY},
    {"model", 'm', 1, S_MODEL, K_MODEL},
    {"max-tokens", 'n', 1, S_SAMPLING, K_MAX_TOKENS},
/* --top-p for top_p: gs_optname_eq takes '-' for '_' */
#define X(name, kind, ctype, lo, hi, bounds, def, help)                                            \
    {#name, 0, 1, S_SAMPLING, (enum gs_key)(K_SAMPLER + SAMPLER_PARAM_##name)},
    SAMPLER_PARAMS(X)
#undef X
        {"temp", 0, 1, S_SAMPLING, (enum gs_key)(K_SAMPLER + SAMPLER_PARAM_temperature)},
    {"seed", 0, 1, S_SAMPLING, K_SEED},
    {"stop", 0, 1, S_SAMPLING, K_STOP},
    {"deadline-ms", 0, 1, S_SAMPLING, K_DEADLINE},
    {"no-retry", 0, 0, S_SAMPLING, K_NO_RETRY},
    {"class", 0, 1, S_SAMPLING, K_CLASS},
    {"verbose", 'v', 0, S_VERBOSE, K_VERBOSE},
    {"system", 0, 1, S_SYSTEM, K_SYSTEM},
    {"watch", 'w', 0, S_WATCH, K_WATCH},
    {"interval", 'i', 1, S_WATCH, K_INTERVAL},
    {"count", 'c', 1, S_WATCH, K_COUNT},
};
#define GS_N_OPTDEFS (sizeof gs_optdefs / sizeof gs_optdefs[0])

static int gs_parse_ll(const char *s, long long lo, long long hi, long long *out)
{
    int64_t v;
    if (num_i64_in(s, lo, hi, &v))
        return -1;
    *out = v;
    return 0;
}

static int gs_parse_f32(const char *s, float *out)
{
    double v;
    if (num_double(s, true, &v))
        return -1;
    *out = (float)v;
    return 0;
}

/* Applies one option with its value. Returns 0 or GS_EXIT_USAGE (message printed). */
static int gs_opt_apply(const char *cmd, gs_opts_t *o, const gs_optdef_t *d, const char *val)
{
    proto_req_t *s = &o->samp;
    long long v;
    if (d->key >= K_SAMPLER) {
        /* only the number is checked here: the daemon checks the range, in one place */
        int i = (int)(d->key - K_SAMPLER);
        float f;
        if (sampler_param_descs[i].kind == SAMPLER_KIND_I32) {
            if (gs_parse_ll(val, INT32_MIN, INT32_MAX, &v))
                return gs_usage_error(cmd, "invalid value '%s' for --%s", val, d->lng);
            proto_req_sampler_set(s, i, (double)v);
        } else {
            if (gs_parse_f32(val, &f))
                return gs_usage_error(cmd, "invalid value '%s' for --%s", val, d->lng);
            proto_req_sampler_set(s, i, f);
        }
        return 0;
    }
    switch (d->key) {
    case K_HELP: o->help = 1; return 0;
    case K_SOCKET: o->socket = val; return 0;
    case K_ADMIN: o->admin_socket = val; return 0;
    case K_API_KEY: o->api_key = val; return 0;
    case K_JSON: o->json = 1; return 0;
    case K_MODEL: o->model = val; return 0;
    case K_VERBOSE: o->verbose = 1; return 0;
    case K_SYSTEM: o->system = val; return 0;
    case K_WATCH: o->watch = 1; return 0;
    case K_MAX_TOKENS:
        if (gs_parse_ll(val, 0, INT32_MAX, &v))
            break;
        s->max_tokens = (int32_t)v;
        s->has_max_tokens = 1;
        return 0;
    case K_SEED:
        if (gs_parse_ll(val, 0, INT64_MAX, &v))
            break;
        s->seed = (uint64_t)v;
        s->has_seed = 1;
        return 0;
    case K_SAMPLER: break;
    case K_DEADLINE:
        if (gs_parse_ll(val, 1, PROTO_MAX_DEADLINE_MS, &v))
            return gs_usage_error(cmd, "--deadline-ms takes 1 to %u (got '%s')",
                                  PROTO_MAX_DEADLINE_MS, val);
        s->deadline_ms = (uint32_t)v;
        return 0;
    case K_NO_RETRY: o->no_retry = 1; return 0;
    case K_CLASS:
        if (strcmp(val, "batch") != 0 && strcmp(val, "interactive") != 0)
            return gs_usage_error(cmd, "--class takes interactive or batch (got '%s')", val);
        s->batch = strcmp(val, "batch") == 0;
        return 0;
    case K_STOP:
        if (s->n_stop >= PROTO_MAX_STOP)
            return gs_usage_error(cmd, "at most %d --stop strings", PROTO_MAX_STOP);
        if (!*val)
            return gs_usage_error(cmd, "--stop needs a non-empty string");
        o->stop[s->n_stop++] = (char *)val;
        s->stop = o->stop;
        return 0;
    case K_INTERVAL: {
        double iv;
        if (num_double_in(val, 0, 86400, &iv) || !(iv > 0))
            return gs_usage_error(cmd, "--interval takes seconds > 0 (got '%s')", val);
        o->interval = iv;
        o->watch = 1;
        return 0;
    }
    case K_COUNT:
        if (gs_parse_ll(val, 1, LONG_MAX, &v))
            return gs_usage_error(cmd, "--count takes a positive integer (got '%s')", val);
        o->count = (long)v;
        o->watch = 1;
        return 0;
    }
    return gs_usage_error(cmd, "invalid value '%s' for --%s", val, d->lng);
}

/* 1 when the nl bytes of name spell the option lng, '-' standing for its '_'. */
static int gs_optname_eq(const char *lng, const char *name, size_t nl)
{
    if (strlen(lng) != nl)
        return 0;
    for (size_t i = 0; i < nl; i++)
        if (lng[i] != name[i] && !(lng[i] == '_' && name[i] == '-'))
            return 0;
    return 1;
}

/* Parses argv[from..argc) as options in the sets allowed (S_GLOBAL always)
 * and positional arguments; stops at the first positional when stop_at_pos.
 * Returns the index it stopped at, or -GS_EXIT_USAGE. */
static int gs_opts_parse(const char *cmd, gs_opts_t *o, unsigned allowed, int argc, char **argv,
                         int from, int stop_at_pos)
{
    allowed |= S_GLOBAL;
    int only_pos = 0;
    int i;
    for (i = from; i < argc; i++) {
        char *a = argv[i];
        if (only_pos || a[0] != '-' || a[1] == '\0') {
            if (stop_at_pos)
                return i;
            o->pos[o->n_pos++] = a;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_pos = 1;
            continue;
        }
        const gs_optdef_t *d = NULL;
        const char *val = NULL;
        if (a[1] == '-') {
            const char *name = a + 2;
            const char *eq = strchr(name, '=');
            size_t nl = eq ? (size_t)(eq - name) : strlen(name);
            for (size_t k = 0; k < GS_N_OPTDEFS; k++)
                if (gs_optname_eq(gs_optdefs[k].lng, name, nl))
                    d = &gs_optdefs[k];
            if (d && eq) {
                if (!d->has_arg)
                    return -gs_usage_error(cmd, "option '--%s' takes no value", d->lng);
                val = eq + 1;
            }
        } else {
            for (size_t k = 0; k < GS_N_OPTDEFS; k++)
                if (gs_optdefs[k].shrt == a[1])
                    d = &gs_optdefs[k];
            if (d && a[2]) {
                if (!d->has_arg)
                    return -gs_usage_error(cmd, "option '-%c' takes no value", a[1]);
                val = a + 2;
            }
        }
        if (!d || !(d->set & allowed)) {
            if (!cmd && d)
                return -gs_usage_error(cmd, "option '%s' goes after the command", a);
            return -gs_usage_error(cmd, "unknown option '%s'%s%s", a, cmd ? " for " : "",
                                   cmd ? cmd : "");
        }
        if (d->has_arg && !val) {
            if (i + 1 >= argc)
                return -gs_usage_error(cmd, "option '%s' needs a value", a);
            val = argv[++i];
        }
        if (gs_opt_apply(cmd, o, d, val))
            return -GS_EXIT_USAGE;
    }
    return i;
}

/* ------------------------------------------------------------------ help */

/* Marks where gs_cmd_help prints the sampling options (gs_sampling_help). */
#define GS_SAMPLING_HELP "\001"

/* The sampling options, from sampler_params.h. */
static void gs_sampling_help(FILE *f)
{
    fputs("  -n, --max-tokens N     tokens to generate at most (default: the model's)\n", f);
    for (int i = 0; i < SAMPLER_PARAM_COUNT; i++) {
        const sampler_param_desc_t *d = &sampler_param_descs[i];
        char opt[64], range[64];
        int n = snprintf(opt, sizeof opt, "--%s%s %s", d->name,
                         i == SAMPLER_PARAM_temperature ? ", --temp" : "",
                         d->kind == SAMPLER_KIND_I32 ? "N" : "F");
        for (int k = 2; k < n && opt[k] != ' ' && opt[k] != ','; k++)
            if (opt[k] == '_')
                opt[k] = '-';
        fprintf(f, "  %-22s %s\n", opt, d->help);
        fprintf(f, "  %-22s in %s; default: the model's (built in: %s)\n", "",
                sampler_param_range_text(d, range, sizeof range), d->def_text);
    }
    fputs("  --seed N               same request + seed + model = same tokens\n"
          "  --stop STR             stop when the text ends with STR (repeatable, up to 16)\n"
          "  --class C              interactive (default) or batch: uses what interactive\n"
          "                         requests leave\n"
          "  --deadline-ms N        the first token is wanted within N ms: refused at once\n"
          "                         (overloaded) when the daemon predicts it cannot be\n"
          "  --no-retry             an overloaded answer that says when to try again\n"
          "                         (retry_after_ms) ends the command; by default it is\n"
          "                         retried after that wait, 3 times and 30 s at most\n",
          f);
}

static const gs_cmd_t gs_cmds[] = {
    {"generate", gs_cmd_generate, S_MODEL | S_SAMPLING | S_VERBOSE,
     "complete a prompt, streaming tokens",
     "usage: gpuswap generate -m MODEL [options] PROMPT...\n"
     "       gpuswap generate -m MODEL [options] < prompt.txt\n"
     "Streams the completion to stdout as it is generated, then a newline. The\n"
     "words of PROMPT are joined with spaces; without PROMPT (or with '-') the\n"
     "prompt is read from stdin. Ctrl-C cancels the request, prints what came so\n"
     "far and exits 130.\n"
     "  -m, --model MODEL      a configured model (see gpuswap models)\n" GS_SAMPLING_HELP
     "  -v, --verbose          print token counts and timing to stderr\n"
     "  --json                 print only the done event, one JSON line\n"},
    {"chat", gs_cmd_chat, S_MODEL | S_SAMPLING | S_VERBOSE | S_SYSTEM,
     "chat with a model (reads stdin)",
     "usage: gpuswap chat -m MODEL [--system TEXT] [options]\n"
     "Reads one user message per line from stdin (a terminal or a pipe), sends\n"
     "the whole conversation so far with the model's chat template, streams the\n"
     "answer and keeps it in the history. '/exit' or end of input ends the chat,\n"
     "'/reset' forgets the history. At a terminal, Ctrl-C stops the answer being\n"
     "generated; at the prompt it exits 130. An error answer ends a piped chat\n"
     "with exit 1; at a terminal the turn is dropped and the chat goes on.\n"
     "  -m, --model MODEL      a configured model\n"
     "  --system TEXT          a system message to start the conversation\n" GS_SAMPLING_HELP
     "  -v, --verbose          print token counts and timing of each answer to stderr\n"
     "  --json                 print each answer's done event as one JSON line\n"},
    {"models", gs_cmd_models, 0, "list the configured models",
     "usage: gpuswap models [--json]\n"
     "Lists the configured models with their state (loading, host, partial,\n"
     "resident, failed), architecture, weight type, bits per weight, parameters and context.\n"
     "Uses the inference socket.\n"},
    {"stats", gs_cmd_stats, S_WATCH, "paging and latency statistics",
     "usage: gpuswap stats [--watch [-i SECONDS] [--count N]] [--json]\n"
     "One row per model: state, resident/quota MiB ('-': no quota), page-ins,\n"
     "evictions (all causes), hit rate (segment hits / lookups), queued requests,\n"
     "time to first token p50/p99; then the device page pool.\n"
     "  -w, --watch            refresh until interrupted (clears the screen on a terminal)\n"
     "  -i, --interval SECONDS between refreshes (default 2; implies --watch)\n"
     "  -c, --count N          stop after N refreshes (implies --watch)\n"
     "  --json                 print the daemon's stats answer, one JSON line per refresh\n"},
    {"load", gs_cmd_admin, S_MODEL, "page a model onto the device now",
     "usage: gpuswap load MODEL [--json]\n"
     "Pages MODEL's weights onto the device and waits until they are all there,\n"
     "drawing a progress bar on stderr when it is a terminal; then prints\n"
     "\"MODEL resident (N MiB in X ms)\". Ctrl-C stops waiting (the load goes on).\n"},
    {"evict", gs_cmd_admin, S_MODEL, "unmap a model from the device",
     "usage: gpuswap evict MODEL [--json]\n"
     "Unmaps MODEL's weights from the device (the host copy stays). A pinned\n"
     "model must be unpinned first.\n"},
    {"pin", gs_cmd_admin, S_MODEL, "never evict a model",
     "usage: gpuswap pin MODEL [--json]\n"
     "Marks MODEL as never evicted (it does not page it in: use load).\n"},
    {"unpin", gs_cmd_admin, S_MODEL, "allow evicting a model again",
     "usage: gpuswap unpin MODEL [--json]\n"},
    {"reload", gs_cmd_admin, 0, "re-read the daemon's configuration",
     "usage: gpuswap reload [--json]\n"
     "Re-reads the configuration file (as SIGHUP does) and prints the models\n"
     "added, removed and changed. A bad file is an error; the old one stays.\n"},
    {"keygen", gs_cmd_keygen, 0, "print a new API key and its config entry",
     "usage: gpuswap keygen [NAME] [--json]\n"
     "Prints a new random API key on the first line, then the auth.keys entry\n"
     "that accepts it (its SHA-256 hash: the daemon never stores the key) for\n"
     "gpuswapd.yaml. Talks to no daemon. --json prints {\"key\",\"hash\",\"name\"}.\n"},
    {"drain", gs_cmd_admin, 0, "finish running requests and stop the daemon",
     "usage: gpuswap drain [--json]\n"
     "The daemon refuses new requests, finishes those in flight, answers with\n"
     "how many completed, and exits with status 0.\n"},
};
#define GS_N_CMDS (sizeof gs_cmds / sizeof gs_cmds[0])

static void gs_help(FILE *f)
{
    fputs("usage: gpuswap [--socket PATH] [--admin-socket PATH] COMMAND [options] [args]\n"
          "The command-line client of gpuswapd.\n\nCommands:\n",
          f);
    for (size_t i = 0; i < GS_N_CMDS; i++)
        fprintf(f, "  %-9s %s\n", gs_cmds[i].name, gs_cmds[i].summary);
    fprintf(f, "  %-9s %s\n", "fleet", "render a fleet's configs (gpuswap fleet --help)");
    fputs(
        "\n'gpuswap COMMAND --help' describes a command. Options of every command:\n"
        "  --socket PATH          inference socket (env GPUSWAP_SOCKET, default " GS_DEFAULT_SOCKET
        ")\n"
        "  --admin-socket PATH    admin socket, for stats load evict pin unpin reload drain\n"
        "                         (env GPUSWAP_ADMIN_SOCKET, default " GS_DEFAULT_ADMIN ")\n"
        "  --api-key KEY          authenticate inference connections with an API key\n"
        "                         (env GPUSWAP_API_KEY); --socket HOST:PORT uses listen.tcp\n"
        "  --json                 print the daemon's answer as one JSON line (errors too)\n"
        "  -h, --help             this help\n"
        "\nExit status:\n"
        "  0    success\n"
        "  1    the daemon answered an error (its code and message are printed on stderr)\n"
        "  2    usage error\n"
        "  3    cannot connect to the daemon, or the connection was lost\n"
        "  130  interrupted (Ctrl-C; 143 for SIGTERM)\n",
        f);
}

static void gs_cmd_help(FILE *f, const gs_cmd_t *c)
{
    const char *mark = strchr(c->help, GS_SAMPLING_HELP[0]);
    if (mark) {
        fwrite(c->help, 1, (size_t)(mark - c->help), f);
        gs_sampling_help(f);
        fputs(mark + 1, f);
    } else {
        fputs(c->help, f);
    }
    fputs("Options of every command: --socket PATH, --admin-socket PATH, --json, --help\n"
          "(see gpuswap --help, which also lists the exit codes).\n",
          f);
}

static const gs_cmd_t *gs_cmd_find(const char *name)
{
    for (size_t i = 0; i < GS_N_CMDS; i++)
        if (strcmp(gs_cmds[i].name, name) == 0)
            return &gs_cmds[i];
    return NULL;
}

/* ------------------------------------------------------------------ main */

static const char *gs_env(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "fleet") == 0)
        return fleet_main(argc - 1, argv + 1); /* talks to no daemon: its own arguments */
    gs_opts_t o;
    memset(&o, 0, sizeof o);
    o.socket = gs_env("GPUSWAP_SOCKET", GS_DEFAULT_SOCKET);
    o.admin_socket = gs_env("GPUSWAP_ADMIN_SOCKET", GS_DEFAULT_ADMIN);
    o.api_key = gs_env("GPUSWAP_API_KEY", NULL);
    o.interval = 2;
    o.pos = calloc((size_t)argc + 1, sizeof *o.pos);
    if (!o.pos) {
        gs_err("out of memory");
        return GS_EXIT_ERROR;
    }
    int rc;
    int i = gs_opts_parse(NULL, &o, 0, argc, argv, 1, 1);
    if (i < 0) {
        rc = -i;
        goto out;
    }
    if (i >= argc) {
        if (o.help) {
            gs_help(stdout);
            rc = GS_EXIT_OK;
        } else {
            gs_help(stderr);
            rc = GS_EXIT_USAGE;
        }
        goto out;
    }
    const char *name = argv[i];
    if (strcmp(name, "help") == 0) {
        const gs_cmd_t *c = i + 1 < argc ? gs_cmd_find(argv[i + 1]) : NULL;
        if (i + 1 < argc && !c) {
            rc = gs_usage_error(NULL, "unknown command '%s'", argv[i + 1]);
            goto out;
        }
        if (c)
            gs_cmd_help(stdout, c);
        else
            gs_help(stdout);
        rc = GS_EXIT_OK;
        goto out;
    }
    const gs_cmd_t *cmd = gs_cmd_find(name);
    if (!cmd) {
        rc = gs_usage_error(NULL, "unknown command '%s'", name);
        goto out;
    }
    int help_first = o.help; /* gpuswap --help CMD */
    o.help = 0;
    i = gs_opts_parse(cmd->name, &o, cmd->opts, argc, argv, i + 1, 0);
    if (i < 0) {
        rc = -i;
        goto out;
    }
    if (o.help || help_first) {
        gs_cmd_help(stdout, cmd);
        rc = GS_EXIT_OK;
        goto out;
    }
    gs_signals_init();
    gs_api_key = o.api_key;
    rc = cmd->run(cmd, &o);
out:
    fflush(stdout);
    free(o.pos);
    return rc;
}
