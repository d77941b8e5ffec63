/* tracesim: compares scheduling policies side by side on the same trace, running the real scheduler and residency code on a virtual device (CSV out, summary table, --self-test). */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "conv.h"
#include "costs.h"
#include "sim.h"
#include "simfleet.h"
#include "vbackend.h"
#include "workload.h"

#define MAX_LOADS 64
#define MAX_FILES 64
#define GIB (1024.0 * 1024.0 * 1024.0)

/* ------------------------------------------------------------------ options */

typedef struct args {
    /* workload */
    int models;
    double zipf, load, rate, duration, cv;
    const char *arrival; /* poisson | gamma */
    double prompt_median, prompt_sigma, output_median, output_sigma;
    unsigned prompt_max, output_max;
    unsigned seed;
    const char *trace;       /* Azure Functions 2019 file */
    const char *requests;    /* recorded request list */
    const char *llm_trace;   /* recorded LLM requests (Azure LLM inference 2023 CSV) */
    const char *tokens_from; /* synthetic arrivals, token counts drawn from this LLM trace */
    wl_req_t *tok;           /* its requests (main owns) */
    size_t n_tok;
    int trace_start, trace_minutes;
    double trace_scale;
    const char *label;
    /* conversations (conv.h) and the prefix cache (simpfx.h) */
    int conversations, turns;
    double think_s, think_sigma;
    const char *prefix_cache; /* off | on | host, comma list: compared side by side */
    int pfx_mode;             /* the one running: PFX_OFF, PFX_ON, PFX_HOST */
    unsigned prefix_entries;
    size_t kv_host;
    /* models and device */
    const char *gguf[MAX_FILES]; /* model files (point into gguf_arg) */
    int n_gguf;
    char *gguf_arg[MAX_FILES]; /* each --gguf value, strdup'ed and split on commas */
    int n_gguf_arg;
    sim_models_t *files; /* the files loaded (main owns) */
    unsigned layers, dim, ff, heads, kv_heads, vocab, experts, experts_used, expert_ff, head_dim;
    int tied;
    double wbytes, page_mib, pool_models, kv_headroom_gib, pool_gib, quota_gib;
    const char *mix; /* model shapes by name, model i has entry i % count */
    sim_shape_t mix_shapes[MAX_FILES];
    int n_mix;
    unsigned max_batch, max_context, ask_tokens, ask_stride;
    /* scheduler */
    double max_wait, max_stall, quantum, min_quantum;
    unsigned queue_limit, max_queued;
    /* cost model */
    double h2d_gbs, copy_lat_us, hbm_gbs, tflops, t_fixed_ms, t_step_ms, t_token_ms, t_round_us,
        slo_ttft, deadline;
    const char *costs; /* h200 | gpu-check figures files */
    int print_costs;
    /* fleet */
    int hosts;
    const char *routing;
    unsigned replicas, balance_factor;
    /* models per GPU */
    double mpg_rate;
    int mpg_max, mpg_step, mpg_seeds;
    /* LoRA adapters (issue 46): on model 0, the other models dense */
    int lora_adapters;
    unsigned lora_rank;
    const char *lora_targets;
    int lora_merged; /* each adapter a merged copy of the base: a dense model of its own */
    /* what to run */
    const char *policies, *sweep, *csv, *dump;
    int no_header, quiet, self_test, help;
    int append; /* the CSV file is appended to (a later --prefix-cache mode) */
    const char *self_test_dir, *write_sample;
} args_t;

typedef enum opt_type {
    OPT_INT,
    OPT_UINT,
    OPT_DBL,
    OPT_STR,
    OPT_FLAG,
    OPT_FILES,
    OPT_SIZE /* bytes, with an optional K, M, G or T (binary) */
} opt_type_t;

enum {
    PFX_OFF = 0,
    PFX_ON,
    PFX_HOST,
    PFX_MODES
};
static const char *const pfx_names[PFX_MODES] = {"off", "on", "host"};

typedef struct opt {
    const char *name;
    opt_type_t type;
    size_t off;
    const char *def;
    const char *help;
} opt_t;

#define A(f) offsetof(args_t, f)
static const opt_t
    opts
        [] =
            {
                {"models", OPT_INT, A(models), "0",
                 "number of models (0: one per --gguf file, else 12)"},
                {"zipf", OPT_DBL, A(zipf), "1.0", "Zipf exponent of model popularity"},
                {"load", OPT_DBL, A(load), "0.5",
                 "offered load as a fraction of the ideal capacity"},
                {"rate", OPT_DBL, A(rate), "0", "requests/s (instead of --load; not with --sweep)"},
                {"duration", OPT_DBL, A(duration), "300", "seconds of arrivals"},
                {"arrival", OPT_STR, A(arrival), "poisson", "poisson | gamma"},
                {"cv", OPT_DBL, A(cv), "3",
                 "gamma: coefficient of variation of inter-arrival times"},
                {"prompt-median", OPT_DBL, A(prompt_median), "256",
                 "prompt tokens, lognormal median"},
                {"prompt-sigma", OPT_DBL, A(prompt_sigma), "0.8", "prompt tokens, lognormal sigma"},
                {"prompt-max", OPT_UINT, A(prompt_max), "2048", "prompt tokens, at most"},
                {"output-median", OPT_DBL, A(output_median), "96",
                 "output tokens, lognormal median"},
                {"output-sigma", OPT_DBL, A(output_sigma), "0.8", "output tokens, lognormal sigma"},
                {"output-max", OPT_UINT, A(output_max), "512", "output tokens, at most"},
                {"seed", OPT_UINT, A(seed), "1", "random seed"},
                {"trace", OPT_STR, A(trace), NULL,
                 "Azure Functions 2019 invocation CSV instead of synthetic arrivals"},
                {"trace-start", OPT_INT, A(trace_start), "0", "trace: first minute"},
                {"trace-minutes", OPT_INT, A(trace_minutes), "0",
                 "trace: minutes (0 = rest of the day)"},
                {"trace-scale", OPT_DBL, A(trace_scale), "1",
                 "trace: time compression (x load); the sweep multiplies it"},
                {"llm-trace", OPT_STR, A(llm_trace), NULL,
                 "Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens): real arrivals and token counts, models a seeded Zipf (--zipf) draw; time divided by --trace-scale x load"},
                {"tokens-from", OPT_STR, A(tokens_from), NULL,
                 "synthetic arrivals (and --models-per-gpu) whose prompt and output tokens are a seeded draw from the requests of this Azure LLM trace CSV (instead of the lognormals; --load's capacity from their means)"},
                {"requests", OPT_STR, A(requests), NULL,
                 "recorded requests instead of synthetic ones: one 'arrival_s model prompt_tokens output_tokens' a line"},
                {"label", OPT_STR, A(label), NULL, "workload name in the CSV"},
                {"conversations", OPT_FLAG, A(conversations), NULL,
                 "conversation workload: sessions of --turns turns bound to one model (Zipf, or uniform with --models-per-gpu), each turn's prompt the session's history plus new tokens (--prompt-*, or --tokens-from), outputs --output-*; --load / --rate count turns"},
                {"turns", OPT_INT, A(turns), "10",
                 "conversations: turns per session, at most (fewer when the context is full)"},
                {"think-s", OPT_DBL, A(think_s), "20",
                 "conversations: mean think time between turns, s (lognormal, open loop)"},
                {"think-sigma", OPT_DBL, A(think_sigma), "0.5",
                 "conversations: sigma of the think time's log"},
                {"prefix-cache", OPT_STR, A(prefix_cache), "on",
                 "conversations: off (every turn prefills its history), on (each session's last turn's KV kept as cached KV, reclaimed before any weights), host (on, plus a host-RAM tier of --kv-host bytes for what the pool reclaims); a comma list runs each, labelled -off, -on, -host"},
                {"prefix-entries", OPT_UINT, A(prefix_entries), "16",
                 "prefix cache entries per model (models.prefix_cache)"},
                {"kv-host", OPT_SIZE, A(kv_host), "64G",
                 "host tier of --prefix-cache host, bytes (K, M, G, T: binary)"},
                {"gguf", OPT_FILES, A(gguf), NULL,
                 "model files (comma list, or repeat): the daemon's store lays them out, model i is file i % count; the shape options are then ignored"},
                {"layers", OPT_UINT, A(layers), "32", "model: layers"},
                {"dim", OPT_UINT, A(dim), "4096", "model: width"},
                {"ff", OPT_UINT, A(ff), "14336", "model: feed-forward width"},
                {"heads", OPT_UINT, A(heads), "32", "model: attention heads"},
                {"kv-heads", OPT_UINT, A(kv_heads), "8", "model: KV heads"},
                {"vocab", OPT_UINT, A(vocab), "128256", "model: vocabulary"},
                {"tied", OPT_INT, A(tied), "0", "model: output head tied to the embedding"},
                {"experts", OPT_UINT, A(experts), "0",
                 "model: mixture of experts, experts per layer (0: dense); each of three dim x --expert-ff matrices, paged in with its layer"},
                {"experts-used", OPT_UINT, A(experts_used), "8",
                 "model: experts a token computes (a step reads those its tokens select)"},
                {"expert-ff", OPT_UINT, A(expert_ff), "768", "model: an expert's width"},
                {"head-dim", OPT_UINT, A(head_dim), "0", "model: per-head width (0: dim / heads)"},
                {"wbytes", OPT_DBL, A(wbytes), "1.0625",
                 "model: bytes per weight (Q8_0 1.0625, F16 2)"},
                {"lora-adapters", OPT_INT, A(lora_adapters), "0",
                 "LoRA adapters on model 0 (the other --models - 1 stay dense): requests go to adapters 1..N of model 0 and the other models, popularity Zipf (--zipf) over the adapters first, then the dense models; with --models-per-gpu the search counts adapters (each at that rate)"},
                {"lora-rank", OPT_UINT, A(lora_rank), "16", "LoRA rank"},
                {"lora-targets", OPT_STR, A(lora_targets), "q,k,v,o",
                 "LoRA targets (q, k, v, o, gate, up, down): A n_in x rank and B rank x n_out per target per layer, at the base's bytes per weight"},
                {"lora-merged", OPT_FLAG, A(lora_merged), NULL,
                 "the baseline of separate merged models: each adapter a full copy of the base, a dense model of its own (models 0..N-1, then the dense ones)"},
                {"mix", OPT_STR, A(mix), NULL,
                 "mixed model shapes, model i has entry i % count (comma list of 3b, 8b, 70b, 30b-a3b (Qwen3-30B-A3B: mixture of experts, 30.5B parameters, 3.3B active), each -q4 (Q4_K_M-sized, 4.85 bits a weight) or -bf16); with --pool-gib"},
                {"quota-gib", OPT_DBL, A(quota_gib), "0",
                 "a model larger than this gets it as its gpu_quota, GiB (0 = none)"},
                {"page-mib", OPT_DBL, A(page_mib), "2", "device page, MiB"},
                {"pool-models", OPT_DBL, A(pool_models), "3",
                 "pool holds this many whole models ..."},
                {"kv-headroom-gib", OPT_DBL, A(kv_headroom_gib), "4",
                 "... plus this much, GiB (KV caches)"},
                {"pool-gib", OPT_DBL, A(pool_gib), "0",
                 "pool size, GiB (overrides the two above when > 0)"},
                {"max-batch", OPT_UINT, A(max_batch), "16", "sequences per model step"},
                {"max-context", OPT_UINT, A(max_context), "4096", "positions per sequence"},
                {"ask-tokens", OPT_UINT, A(ask_tokens), "0",
                 "clients ask for max_tokens this (within the context, at least the output) and stop at the output (0: ask for the output)"},
                {"ask-stride", OPT_UINT, A(ask_stride), "1",
                 "--ask-tokens applies to the clients of every this-many-th model (model % stride == 0); the others ask for their output"},
                {"max-wait", OPT_DBL, A(max_wait), "2", "scheduler.max_wait, s"},
                {"max-stall", OPT_DBL, A(max_stall), "0.5",
                 "scheduler.max_stall, s (0 = no bound)"},
                {"quantum", OPT_DBL, A(quantum), "4", "scheduler.quantum (x swap-in time)"},
                {"min-quantum", OPT_DBL, A(min_quantum), "0.05", "quantum floor, s (the worker's)"},
                {"queue-limit", OPT_UINT, A(queue_limit), "1000000", "scheduler.queue_limit"},
                {"max-queued", OPT_UINT, A(max_queued), "10000000", "scheduler.max_queued"},
                {"h2d-gbs", OPT_DBL, A(h2d_gbs), "25", "cost: host->device copy bandwidth, GB/s"},
                {"copy-lat-us", OPT_DBL, A(copy_lat_us), "10", "cost: fixed time per copy, us"},
                {"hbm-gbs", OPT_DBL, A(hbm_gbs), "3000",
                 "cost: device memory bandwidth, GB/s (0: no memory terms)"},
                {"tflops", OPT_DBL, A(tflops), "400",
                 "cost: matmul throughput, TFLOP/s (0: no matmul terms)"},
                {"t-fixed-ms", OPT_DBL, A(t_fixed_ms), "1",
                 "cost: fixed time per step before the pass, ms"},
                {"t-step-ms", OPT_DBL, A(t_step_ms), "0",
                 "cost: measured compute per step, ms (spread over the layers)"},
                {"t-token-ms", OPT_DBL, A(t_token_ms), "0",
                 "cost: measured compute per token of a step, ms (spread over the layers)"},
                {"t-round-us", OPT_DBL, A(t_round_us), "10",
                 "cost: host time per scheduling round, us"},
                {"costs",
                 OPT_STR, A(costs), NULL, "cost: 'h200' (datasheet: 55 GB/s host->device, 4.8 TB/s HBM, 989 TFLOP/s) or gpu-check figures files (gpu-check-1-figures.txt,gpu-check-2-figures.txt; comma-separated or concatenated): their measured page-in GB/s, decode step times by batch and context, prefill; a figure it lacks stays the datasheet's; replaces --h2d-gbs --hbm-gbs --tflops --t-fixed-ms --t-step-ms --t-token-ms; stderr says which figures it used"},
                {"print-costs", OPT_FLAG, A(print_costs), NULL,
                 "print the cost model's device figures (and where they came from) and exit"},
                {"slo-ttft", OPT_DBL, A(slo_ttft), "2", "SLO: time to first token below this, s"},
                {"deadline", OPT_DBL, A(deadline), "0",
                 "every request's first-token deadline, s (0: none): default and fifo refuse a request predicted to miss it, on arrival or while queued (the daemon's rule, docs/overload.md), as lru-batch-drop does; refused requests count as misses in ttft_p99 and slo_frac"},
                {"hosts", OPT_INT, A(hosts), "0",
                 "fleet mode: this many hosts, each a pool as above, behind a router (0: one host, the policies side by side)"},
                {"routing", OPT_STR, A(routing), "affinity,round-robin,least-loaded",
                 "fleet: routers to compare (affinity: placed as gpuswap fleet render does, HAProxy's bounded-load hash over the replicas; round-robin and least-loaded: every host serves every model)"},
                {"replicas", OPT_UINT, A(replicas), "2",
                 "fleet affinity: replicas per model at least (more for a model with over half a host's share of the requests)"},
                {"balance-factor", OPT_UINT, A(balance_factor), "150",
                 "fleet affinity: HAProxy hash-balance-factor, percent (fleet.yaml proxy.balance_factor)"},
                {"models-per-gpu", OPT_DBL, A(mpg_rate), "0",
                 "search, per policy, the most models (uniform, this many req/s each) whose p99 TTFT stays within --slo-ttft; to within --mpg-step models"},
                {"mpg-max", OPT_INT, A(mpg_max), "200", "models per GPU: most models tried"},
                {"mpg-step", OPT_INT, A(mpg_step), "5", "models per GPU: resolution of the search"},
                {"mpg-seeds", OPT_INT, A(mpg_seeds), "1",
                 "models per GPU: a count passes when its p99 TTFT is within --slo-ttft with each of this many seeds (--seed, --seed + 1, ...); reported: the worst seed's p99 (of a count that fails, the first seed's over the target)"},
                {"policies", OPT_STR, A(policies), "default,fifo,lru,belady",
                 "policies to compare: default, fifo, lru, lru-batch (N = 1 up to the models the pool holds, and the best per metric), lru-batch-N (one N), lru-batch-drop and lru-batch-drop-N (the same with --deadline's refusals), belady; with --lora-adapters lora-slots (multi-LoRA with S device adapter slots, LRU: S = 1, 2, 4, ... up to --max-batch, and the best per metric) and lora-slots-S (one S)"},
                {"sweep", OPT_STR, A(sweep), NULL,
                 "comma-separated load levels to run (instead of --load)"},
                {"csv", OPT_STR, A(csv), NULL, "write results here (default: stdout)"},
                {"dump-requests", OPT_STR, A(dump), NULL,
                 "write policy,index,model,arrival,prompt,output,state,ttft,e2e,swapped per request here"},
                {"no-header", OPT_FLAG, A(no_header), NULL, "omit the CSV header"},
                {"quiet", OPT_FLAG, A(quiet), NULL, "no summary table on stderr"},
                {"self-test", OPT_FLAG, A(self_test), NULL, "run the simulator's checks"},
                {"self-test-dir", OPT_STR, A(self_test_dir), "/tmp",
                 "where --self-test writes its sample trace"},
                {"write-azure-sample", OPT_STR, A(write_sample), NULL,
                 "write a synthetic Azure-format trace and exit"},
                {"help", OPT_FLAG, A(help), NULL, "this text"},
};
#define N_OPTS (sizeof opts / sizeof opts[0])

static int opt_set(args_t *a, const opt_t *o, const char *v)
{
    void *p = (char *)a + o->off;
    char *end = NULL;
    switch (o->type) {
    case OPT_INT: *(int *)p = (int)strtol(v, &end, 10); break;
    case OPT_UINT: {
        long x = strtol(v, &end, 10);
        if (x < 0)
            return -1;
        *(unsigned *)p = (unsigned)x;
        break;
    }
    case OPT_DBL: *(double *)p = strtod(v, &end); break;
    case OPT_SIZE: {
        double x = strtod(v, &end);
        const char *u = "KMGT", *k = end && *end ? strchr(u, *end) : NULL;
        if (k && *end) {
            x *= pow(1024.0, (double)(k - u + 1));
            end += end[1] == 'i' && end[2] == 'B' ? 3 : 1;
        }
        if (x < 0)
            return -1;
        *(size_t *)p = (size_t)x;
        break;
    }
    case OPT_STR: *(const char **)p = v; return 0;
    case OPT_FLAG: *(int *)p = 1; return 0;
    case OPT_FILES: {
        if (a->n_gguf_arg == MAX_FILES || !(a->gguf_arg[a->n_gguf_arg] = strdup(v)))
            return -1;
        char *save = NULL;
        for (char *t = strtok_r(a->gguf_arg[a->n_gguf_arg++], ",", &save); t;
             t = strtok_r(NULL, ",", &save)) {
            if (a->n_gguf == MAX_FILES)
                return -1;
            a->gguf[a->n_gguf++] = t;
        }
        return 0;
    }
    }
    return end && *end == 0 && end != v ? 0 : -1;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: tracesim [--option value ...]\n"
               "Runs gpuswapd's scheduler and residency manager on a virtual device and compares\n"
               "policies (default, fifo, lru, lru-batch N, belady) on the same trace. Options:\n");
    for (size_t i = 0; i < N_OPTS; i++)
        fprintf(f, "  --%-20s %s%s%s%s\n", opts[i].name, opts[i].help, opts[i].def ? " [" : "",
                opts[i].def ? opts[i].def : "", opts[i].def ? "]" : "");
}

static int parse_args(args_t *a, int argc, char **argv)
{
    memset(a, 0, sizeof *a);
    for (size_t i = 0; i < N_OPTS; i++)
        if (opts[i].def && opt_set(a, &opts[i], opts[i].def))
            return -1;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (strncmp(s, "--", 2)) {
            fprintf(stderr, "tracesim: unexpected argument '%s'\n", s);
            return -1;
        }
        s += 2;
        const opt_t *o = NULL;
        for (size_t j = 0; j < N_OPTS && !o; j++)
            if (strcmp(opts[j].name, s) == 0)
                o = &opts[j];
        if (!o) {
            fprintf(stderr, "tracesim: unknown option --%s (see --help)\n", s);
            return -1;
        }
        const char *v = "1";
        if (o->type != OPT_FLAG) {
            if (i + 1 >= argc) {
                fprintf(stderr, "tracesim: --%s needs a value\n", s);
                return -1;
            }
            v = argv[++i];
        }
        if (opt_set(a, o, v)) {
            fprintf(stderr, "tracesim: --%s: bad value '%s'\n", s, v);
            return -1;
        }
    }
    return 0;
}

/* --mix shapes by name: Llama-3.2-3B, Llama-3-8B, Llama-3-70B, and Qwen3-30B-A3B (mixture of
 * experts: 30.5B parameters, 3.3B active; 128 experts of width 768, 8 a token, 48 layers, head
 * width 128, no dense FFN). */
static const struct {
    const char *name;
    sim_shape_t sh;
} mix_table[] = {
    {"3b",
     {.n_layer = 28,
      .n_embd = 3072,
      .n_ff = 8192,
      .n_head = 24,
      .n_head_kv = 8,
      .n_vocab = 128256,
      .tied = 1}},
    {"8b",
     {.n_layer = 32,
      .n_embd = 4096,
      .n_ff = 14336,
      .n_head = 32,
      .n_head_kv = 8,
      .n_vocab = 128256}},
    {"70b",
     {.n_layer = 80,
      .n_embd = 8192,
      .n_ff = 28672,
      .n_head = 64,
      .n_head_kv = 8,
      .n_vocab = 128256}},
    {"30b-a3b",
     {.n_layer = 48,
      .n_embd = 2048,
      .n_ff = 0,
      .n_head = 32,
      .n_head_kv = 4,
      .n_vocab = 151936,
      .n_expert = 128,
      .n_expert_used = 8,
      .n_ff_exp = 768,
      .head_dim = 128}},
};

/* --mix: "3b-q4,8b-bf16,70b-q4,30b-a3b-q4": shapes of mix_table, each with a weight size. */
static int parse_mix(args_t *a)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", a->mix);
    a->n_mix = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        sim_shape_t sh;
        char *dash = strrchr(t, '-');
        if (!dash || a->n_mix == MAX_FILES)
            return -1;
        *dash = 0;
        size_t i = 0, n = sizeof mix_table / sizeof mix_table[0];
        while (i < n && strcmp(t, mix_table[i].name) != 0)
            i++;
        if (i == n)
            return -1;
        sh = mix_table[i].sh;
        if (strcmp(dash + 1, "q4") == 0)
            sh.wbytes = 4.85 / 8;
        else if (strcmp(dash + 1, "bf16") == 0)
            sh.wbytes = 2;
        else
            return -1;
        a->mix_shapes[a->n_mix++] = sh;
    }
    return a->n_mix ? 0 : -1;
}

static void args_free(args_t *a)
{
    for (int i = 0; i < a->n_gguf_arg; i++)
        free(a->gguf_arg[i]);
    a->n_gguf_arg = a->n_gguf = 0;
    sim_models_free(a->files);
    a->files = NULL;
    free(a->tok);
    a->tok = NULL;
}

/* What a synthetic trace draws its models over: the adapters of model 0, then the other
 * models (lora_map places them). */
static int wl_units(const args_t *a)
{
    return a->lora_adapters > 0 ? a->lora_adapters + a->models - 1 : a->models;
}

/* A trace drawn over wl_units: unit u < N is adapter u + 1 of model 0 (or with --lora-merged
 * model u, a merged copy), unit u >= N is dense model u - N + 1 (merged: u). */
static void lora_map(const args_t *a, wl_req_t *reqs, size_t n)
{
    int na = a->lora_adapters;
    for (size_t i = 0; i < n && na > 0; i++) {
        int u = reqs[i].model;
        reqs[i].adapter = !a->lora_merged && u < na ? (uint32_t)u + 1 : 0;
        reqs[i].model = a->lora_merged ? u : u < na ? 0 : u - na + 1;
    }
}

/* --lora-targets as SIM_LORA_* bits; 0 when bad. */
static unsigned lora_targets(const char *s)
{
    static const char *const names[] = {"q", "k", "v", "o", "gate", "up", "down"};
    char buf[128];
    snprintf(buf, sizeof buf, "%s", s ? s : "");
    unsigned bits = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        unsigned b = 0;
        for (unsigned k = 0; k < sizeof names / sizeof names[0]; k++)
            if (strcmp(t, names[k]) == 0)
                b = 1u << k;
        if (!b)
            return 0;
        bits |= b;
    }
    return bits;
}

static void build_cfg(const args_t *a, sim_cfg_t *c)
{
    memset(c, 0, sizeof *c);
    c->n_models = a->lora_adapters > 0 && a->lora_merged ? wl_units(a) : a->models;
    c->shape = (sim_shape_t){.n_layer = a->layers,
                             .n_embd = a->dim,
                             .n_ff = a->ff,
                             .n_head = a->heads,
                             .n_head_kv = a->kv_heads,
                             .n_vocab = a->vocab,
                             .wbytes = a->wbytes,
                             .tied = a->tied,
                             .n_expert = a->experts,
                             .n_expert_used = a->experts ? a->experts_used : 0,
                             .n_ff_exp = a->experts ? a->expert_ff : 0,
                             .head_dim = a->head_dim};
    if (a->files) {
        c->models = a->files;
        sim_models_shape(a->files, 0, &c->shape); /* pool sizing and the summary */
    }
    if (a->n_mix) {
        c->shapes = a->mix_shapes;
        c->n_shapes = a->n_mix;
        c->shape = a->mix_shapes[0];
    }
    c->quota_bytes = (size_t)(a->quota_gib * GIB);
    c->page_size = (size_t)(a->page_mib * 1048576.0);
    size_t headroom = (size_t)(a->kv_headroom_gib * GIB);
    if (a->pool_gib > 0)
        c->pool_bytes = (size_t)(a->pool_gib * GIB) / c->page_size * c->page_size;
    else if (a->files) /* whole images as the store lays them out */
        c->pool_bytes = (size_t)(((double)sim_models_image_bytes(a->files, 0) * a->pool_models +
                                  (double)headroom) /
                                 (double)c->page_size) *
                        c->page_size;
    else
        c->pool_bytes = sim_pool_bytes(&c->shape, c->page_size, a->pool_models, headroom);
    c->max_batch = a->max_batch;
    c->max_context = a->max_context;
    c->ask_tokens = a->ask_tokens;
    c->ask_stride = a->ask_stride;
    c->sched = (sched_cfg_t){.max_wait_s = a->max_wait,
                             .max_stall_s = a->max_stall,
                             .quantum = a->quantum,
                             .min_quantum_s = a->min_quantum,
                             .queue_limit = a->queue_limit,
                             .max_queued = a->max_queued};
    c->cost = (sim_cost_t){.h2d_bw = a->h2d_gbs * 1e9,
                           .copy_lat_s = a->copy_lat_us * 1e-6,
                           .hbm_bw = a->hbm_gbs * 1e9,
                           .flops = a->tflops * 1e12,
                           .t_fixed_s = a->t_fixed_ms * 1e-3,
                           .t_step_s = a->t_step_ms * 1e-3,
                           .t_token_s = a->t_token_ms * 1e-3,
                           .t_round_s = a->t_round_us * 1e-6};
    c->slo_ttft_s = a->slo_ttft;
    c->deadline_s = a->deadline;
    c->prefix_cache = a->conversations && a->pfx_mode != PFX_OFF;
    c->prefix_entries = a->prefix_entries;
    c->kv_host_bytes = a->pfx_mode == PFX_HOST ? a->kv_host : 0;
    if (a->lora_adapters > 0 && !a->lora_merged) {
        const sim_shape_t *sh = sim_cfg_shape(c, 0);
        c->lora_n = (uint32_t)a->lora_adapters;
        c->lora_params = sim_lora_params(sh, a->lora_rank, lora_targets(a->lora_targets));
        c->lora_bytes = c->lora_params * sh->wbytes;
    }
}

static wl_len_t len_of(double median, double sigma, unsigned max)
{
    return (wl_len_t){.median = median, .sigma = sigma, .min = 1, .max = max};
}

/* ------------------------------------------------------------------ running */

typedef struct row {
    double load, rate;
    sim_policy_t pol;
    uint32_t lrub_n; /* lru-batch: models kept loaded; 0 with best set: the best row */
    int best;        /* the best lru-batch N per metric (page-ins, TTFT, end-to-end) */
    int drop;        /* lru-batch-drop */
    int route;       /* fleet: its simfleet_route_t; -1: one host */
    int hosts;       /* fleet: hosts */
    int host_models; /* fleet: most models a host is configured with */
    sim_result_t r;
} row_t;

static double capacity(const args_t *a, const sim_cfg_t *c)
{
    if (a->n_tok) {
        double sp = 0, so = 0;
        for (size_t i = 0; i < a->n_tok; i++)
            sp += a->tok[i].prompt, so += a->tok[i].output;
        return sim_capacity(c, sp / (double)a->n_tok, so / (double)a->n_tok);
    }
    wl_len_t p = len_of(a->prompt_median, a->prompt_sigma, a->prompt_max);
    wl_len_t o = len_of(a->output_median, a->output_sigma, a->output_max);
    return sim_capacity(c, wl_len_mean(&p), wl_len_mean(&o));
}

/* Synthetic requests: their token counts from --tokens-from, if given. */
static void tokens_from(const args_t *a, wl_req_t *reqs, size_t n)
{
    if (a->n_tok)
        wl_tokens_draw(reqs, n, a->tok, a->n_tok, (uint64_t)a->seed);
}

/* A conversation workload of rate turns/s over n_models (conv.h); *reqs malloc'ed. */
static int conv_trace(const args_t *a, int n_models, double zipf, double rate, uint64_t seed,
                      wl_req_t **reqs, size_t *n, char *err, size_t errlen)
{
    conv_params_t cp = {.n_models = n_models,
                        .zipf_s = zipf,
                        .rate = rate,
                        .duration_s = a->duration,
                        .turns = a->turns,
                        .think_s = a->think_s,
                        .think_sigma = a->think_sigma,
                        .prompt = len_of(a->prompt_median, a->prompt_sigma, a->prompt_max),
                        .output = len_of(a->output_median, a->output_sigma, a->output_max),
                        .tok = a->tok,
                        .n_tok = a->n_tok,
                        .max_ctx = a->max_context,
                        .seed = seed};
    int rc = conv_generate(&cp, reqs, n);
    if (rc)
        snprintf(err, errlen, "cannot generate the conversations (%d)", rc);
    return rc;
}

/* The trace for one load level; *reqs malloc'ed. */
static int make_trace(const args_t *a, const sim_cfg_t *c, double load, double *rate,
                      wl_req_t **reqs, size_t *n, char *err, size_t errlen)
{
    wl_len_t p = len_of(a->prompt_median, a->prompt_sigma, a->prompt_max);
    wl_len_t o = len_of(a->output_median, a->output_sigma, a->output_max);
    if (a->requests) {
        int rc = wl_requests_read(a->requests, a->models, reqs, n, err, errlen);
        if (rc == 0) {
            double span = *n ? (*reqs)[*n - 1].t - (*reqs)[0].t : 0;
            *rate = span > 0 ? (double)*n / span : 0;
        }
        return rc;
    }
    if (a->llm_trace) {
        wl_llm_trace_t lt = {.n_models = wl_units(a),
                             .zipf_s = a->zipf,
                             .time_scale = a->trace_scale * load,
                             .max_ctx = a->max_context,
                             .seed = (uint64_t)a->seed};
        int rc = wl_llm_trace_read(a->llm_trace, &lt, reqs, n, err, errlen);
        if (rc == 0) {
            double span = *n ? (*reqs)[*n - 1].t : 0;
            *rate = span > 0 ? (double)*n / span : 0;
            lora_map(a, *reqs, *n);
        }
        return rc;
    }
    if (a->trace) {
        wl_azure_t az = {.n_models = a->models,
                         .start_min = a->trace_start,
                         .n_min = a->trace_minutes,
                         .time_scale = a->trace_scale * load,
                         .prompt = p,
                         .output = o,
                         .seed = (uint64_t)a->seed};
        int rc = wl_azure_read(a->trace, &az, reqs, n, err, errlen);
        if (rc == 0) {
            double span = *n ? (*reqs)[*n - 1].t : 0;
            *rate = span > 0 ? (double)*n / span : 0;
        }
        return rc;
    }
    *rate = load * capacity(a, c) * (a->hosts > 0 ? a->hosts : 1);
    if (a->conversations)
        return conv_trace(a, a->models, a->zipf, *rate, (uint64_t)a->seed, reqs, n, err, errlen);
    wl_params_t wp = {.n_models = wl_units(a),
                      .zipf_s = a->zipf,
                      .rate = *rate,
                      .duration_s = a->duration,
                      .arrival =
                          strcmp(a->arrival, "gamma") == 0 ? WL_ARRIVAL_GAMMA : WL_ARRIVAL_POISSON,
                      .cv = a->cv,
                      .prompt = p,
                      .output = o,
                      .seed = (uint64_t)a->seed};
    int rc = wl_generate(&wp, reqs, n);
    if (rc) {
        snprintf(err, errlen, "cannot generate the workload (%d)", rc);
    } else {
        tokens_from(a, *reqs, *n);
        lora_map(a, *reqs, *n);
    }
    return rc;
}

static int parse_routes(const char *s, simfleet_route_t *out, int *n)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    *n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n >= SIMFLEET_ROUTE_COUNT || simfleet_route_parse(t, &out[*n]))
            return -1;
        (*n)++;
    }
    return *n ? 0 : -1;
}

/* Each model's expected share of the requests (the fleet file's load, what
 * affinity places by): the Zipf law of a synthetic trace, else the trace's
 * own counts (plus one, so no model is without load). *out malloc'ed. */
static int model_loads(const args_t *a, const wl_req_t *reqs, size_t n, double **out)
{
    double *l = calloc((size_t)a->models, sizeof *l);
    if (!l)
        return -1;
    if (!a->trace && !a->requests && !a->llm_trace) {
        wl_params_t wp = {.n_models = a->models, .zipf_s = a->zipf};
        for (int m = 0; m < a->models; m++)
            l[m] = wl_popularity(&wp, m);
    } else {
        for (size_t i = 0; i < n; i++)
            l[reqs[i].model] += 1;
        for (int m = 0; m < a->models; m++)
            l[m] = (l[m] + 1) / ((double)n + a->models);
    }
    *out = l;
    return 0;
}

#define MAX_POLS 64

/* A policy to run: lru-batch with its N (0: every N from 1 to the models
 * the pool holds, and the best of them). */
typedef struct pol_spec {
    sim_policy_t pol;
    uint32_t n;
    int drop; /* lru-batch-drop: refuses as the default does under --deadline */
} pol_spec_t;

/* "default,fifo,lru,lru-batch,lru-batch-3,belady" */
static int parse_policies(const char *s, pol_spec_t *out, int *n)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    *n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n >= MAX_POLS)
            return -1;
        out[*n].n = 0;
        out[*n].drop = strncmp(t, "lru-batch-drop", 14) == 0;
        if (out[*n].drop && !t[14]) {
            out[*n].pol = SIM_POL_LRU_BATCH;
        } else if (strncmp(t, "lora-slots-", 11) == 0) {
            char *end;
            long k = strtol(t + 11, &end, 10);
            if (*end || k < 1 || k > 100000)
                return -1;
            out[*n].pol = SIM_POL_LORA_SLOTS;
            out[*n].n = (uint32_t)k;
        } else if (strncmp(t, "lru-batch-", 10) == 0) {
            char *end;
            long k = strtol(t + (out[*n].drop ? 15 : 10), &end, 10);
            if (*end || k < 1 || k > 1000)
                return -1;
            out[*n].pol = SIM_POL_LRU_BATCH;
            out[*n].n = (uint32_t)k;
        } else if (sim_policy_parse(t, &out[*n].pol)) {
            return -1;
        }
        (*n)++;
    }
    return *n ? 0 : -1;
}

/* Models that fit the pool at once, lru-batch's N runs to it: counted with
 * the largest model, or with mixed shapes the mean (each at most its quota). */
static uint32_t pool_holds(const sim_cfg_t *c)
{
    size_t img = 0;
    double sum = 0;
    for (int i = 0; i < c->n_models; i++) {
        size_t b = c->models ? sim_models_image_bytes(c->models, i % sim_models_count(c->models))
                             : sim_model_bytes(sim_cfg_shape(c, i), c->page_size);
        if (c->quota_bytes && b > c->quota_bytes)
            b = c->quota_bytes;
        sum += (double)b;
        if (b > img)
            img = b;
    }
    if (c->n_shapes > 1 && c->n_models > 0)
        img = (size_t)(sum / c->n_models);
    uint32_t k = img ? (uint32_t)(c->pool_bytes / img) : 1;
    if (k > (uint32_t)c->n_models)
        k = (uint32_t)c->n_models;
    return k ? k : 1;
}

/* Expand the specs into the runs: lru-batch without N is N = 1..k plus the
 * best row (filled after the runs). */
static int expand_policies(const pol_spec_t *in, int n_in, const sim_cfg_t *c, pol_spec_t *out,
                           int *best, int *n)
{
    *n = 0;
    for (int i = 0; i < n_in; i++) {
        if (in[i].pol == SIM_POL_LORA_SLOTS && !in[i].n) { /* S = 1, 2, 4, ... max_batch */
            uint32_t mb = c->max_batch;
            for (uint32_t j = 1;; j = j < mb && 2 * j > mb ? mb : 2 * j) {
                if (*n >= MAX_POLS)
                    return -1;
                int last = j > c->max_batch;
                best[*n] = last;
                out[(*n)++] = (pol_spec_t){SIM_POL_LORA_SLOTS, last ? 0 : j, 0};
                if (last)
                    break;
            }
            continue;
        }
        if (in[i].pol != SIM_POL_LRU_BATCH || in[i].n) {
            if (*n >= MAX_POLS)
                return -1;
            best[*n] = 0;
            out[(*n)++] = in[i];
            continue;
        }
        uint32_t k = pool_holds(c);
        for (uint32_t j = 1; j <= k + 1; j++) {
            if (*n >= MAX_POLS)
                return -1;
            best[*n] = j == k + 1;
            out[(*n)++] = (pol_spec_t){SIM_POL_LRU_BATCH, j == k + 1 ? 0 : j, in[i].drop};
        }
    }
    return 0;
}

/* The best lru-batch N per metric over rows[from..to): page-ins, p50/p99
 * TTFT, p50/p99 end-to-end and the SLO share each take the best row's
 * figure; the rest are those of the row with the best p99 TTFT. */
static void best_row(row_t *dst, const row_t *rows, int from, int to)
{
    int bi = -1;
    for (int i = from; i < to; i++)
        if (rows[i].pol == dst->pol && !rows[i].best && rows[i].drop == dst->drop &&
            (bi < 0 || rows[i].r.ttft_p99 < rows[bi].r.ttft_p99))
            bi = i;
    if (bi < 0)
        return;
    sim_result_t r = rows[bi].r;
    for (int i = from; i < to; i++) {
        const sim_result_t *x = &rows[i].r;
        if (rows[i].pol != dst->pol || rows[i].best || rows[i].drop != dst->drop)
            continue;
#define BEST_MIN(f)                                                                                \
    if (x->f < r.f)                                                                                \
    r.f = x->f
        BEST_MIN(page_ins);
        BEST_MIN(model_loads);
        BEST_MIN(bytes_in);
        BEST_MIN(ttft_p50);
        BEST_MIN(ttft_p99);
        BEST_MIN(ttft_max);
        BEST_MIN(e2e_p50);
        BEST_MIN(e2e_p99);
        BEST_MIN(e2e_max);
        BEST_MIN(adm_ttft_p99);
#undef BEST_MIN
        if (x->slo_frac > r.slo_frac)
            r.slo_frac = x->slo_frac;
    }
    dst->r = r;
}

static int parse_loads(const args_t *a, double *loads, int *n)
{
    *n = 0;
    if (!a->sweep) {
        sim_cfg_t c;
        build_cfg(a, &c);
        loads[(*n)++] = a->trace || a->requests || a->llm_trace ? 1.0
                        : a->rate > 0                           ? a->rate / capacity(a, &c)
                                                                : a->load;
        return 0;
    }
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", a->sweep);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *end;
        double x = strtod(t, &end);
        if (*end || x <= 0 || *n >= MAX_LOADS)
            return -1;
        loads[(*n)++] = x;
    }
    return *n ? 0 : -1;
}

static const char *const csv_header =
    "workload,load,rate_rps,policy,requests,completed,failed,page_ins,model_loads,bytes_in,"
    "belady_own,belady_k,gpu_busy,copy_busy,ttft_p50_s,ttft_p99_s,ttft_max_s,e2e_p50_s,"
    "e2e_p99_s,e2e_max_s,slo_frac,steps,makespan_s,violations,host_blocks,preempted,"
    "throughput_rps,hosts,host_models,kv_recomputes,prompt_tokens,prefill_tokens,pfx_hit_tokens,"
    "kv_demotions,kv_device_drops,kv_host_drops,kv_restores,kv_restore_tokens,kv_host_recomputes,"
    "refused,adm_ttft_p99_s\n";

/* What a row compares: the policy, or in a fleet the router. */
static const char *row_name(const row_t *w)
{
    static char buf[32]; /* one name at a time: printed before the next call */
    if (w->route >= 0)
        return simfleet_route_name((simfleet_route_t)w->route);
    if (w->pol == SIM_POL_LRU_BATCH) {
        if (w->best)
            return w->drop ? "lru-batch-drop-best" : "lru-batch-best";
        snprintf(buf, sizeof buf, "lru-batch-%s%u", w->drop ? "drop-" : "", w->lrub_n);
        return buf;
    }
    if (w->pol == SIM_POL_LORA_SLOTS) {
        if (w->best)
            return "lora-slots-best";
        snprintf(buf, sizeof buf, "lora-slots-%u", w->lrub_n);
        return buf;
    }
    return sim_policy_name(w->pol);
}

static void csv_row(FILE *f, const char *wl, const row_t *w)
{
    const sim_result_t *r = &w->r;
    fprintf(f,
            "%s,%.4g,%.6g,%s,%zu,%zu,%zu,%llu,%llu,%llu,%llu,%u,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,"
            "%.6f,%.6f,%.6f,%llu,%.6f,%llu,%llu,%llu,%.6f,%d,%d,%llu,%llu,%llu,%llu,%llu,%llu,%llu,"
            "%llu,%llu,%llu,%zu,%.6f\n",
            wl, w->load, w->rate, row_name(w), r->requests, r->completed, r->failed,
            (unsigned long long)r->page_ins, (unsigned long long)r->model_loads,
            (unsigned long long)r->bytes_in, (unsigned long long)r->belady_own, r->belady_k,
            r->gpu_busy, r->copy_busy, r->ttft_p50, r->ttft_p99, r->ttft_max, r->e2e_p50,
            r->e2e_p99, r->e2e_max, r->slo_frac, (unsigned long long)r->steps, r->makespan_s,
            (unsigned long long)r->violations, (unsigned long long)r->host_blocks,
            (unsigned long long)r->preempted,
            r->makespan_s > 0 ? (double)r->completed / r->makespan_s : NAN,
            w->route >= 0 ? w->hosts : 1, w->host_models, (unsigned long long)r->recomputes,
            (unsigned long long)r->prompt_tokens, (unsigned long long)r->prefill_tokens,
            (unsigned long long)r->pfx_hit_tokens, (unsigned long long)r->kv_demotions,
            (unsigned long long)r->kv_device_drops, (unsigned long long)r->kv_host_drops,
            (unsigned long long)r->kv_restores, (unsigned long long)r->kv_restore_tokens,
            (unsigned long long)r->kv_host_recomputes, r->refused, r->adm_ttft_p99);
}

static void table_head(FILE *f)
{
    fprintf(f, "%-6s %-12s %6s %8s %7s %9s %5s %8s %8s %8s %8s %8s %6s\n", "load", "policy",
            "req/s", "page-ins", "loads", "GB in", "busy", "ttft50", "ttft99", "ttftmax", "e2e50",
            "e2e99", "slo");
}

static void table_row(FILE *f, const row_t *w)
{
    const sim_result_t *r = &w->r;
    fprintf(f, "%-6.3g %-12s %6.2f %8llu %7llu %9.1f %5.2f %8.3f %8.3f %8.3f %8.3f %8.3f %6.3f\n",
            w->load, row_name(w), w->rate, (unsigned long long)r->page_ins,
            (unsigned long long)r->model_loads, r->bytes_in / 1e9, r->gpu_busy, r->ttft_p50,
            r->ttft_p99, r->ttft_max, r->e2e_p50, r->e2e_p99, r->slo_frac);
}

/* Runs every policy at every load; rows malloc'ed into *out. */
static int run_all(const args_t *a, row_t **out, int *n_out, char *err, size_t errlen)
{
    sim_cfg_t c;
    build_cfg(a, &c);
    pol_spec_t specs[MAX_POLS], pols[MAX_POLS];
    int best[MAX_POLS] = {0};
    int np, ns;
    double loads[MAX_LOADS];
    int nl;
    simfleet_route_t routes[SIMFLEET_ROUTE_COUNT];
    int nr = 0;
    if (parse_policies(a->policies, specs, &ns) ||
        expand_policies(specs, ns, &c, pols, best, &np) || parse_loads(a, loads, &nl) ||
        (a->hosts > 0 && parse_routes(a->routing, routes, &nr))) {
        snprintf(err, errlen, "bad --policies, --routing or --sweep");
        return -1;
    }
    if (a->hosts > 0)
        np = nr; /* a fleet compares routers, every host on the default policy */
    row_t *rows = calloc((size_t)(np * nl), sizeof *rows);
    if (!rows) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (a->dump) {
        c.dump = fopen(a->dump, "w");
        if (!c.dump) {
            snprintf(err, errlen, "cannot write %s", a->dump);
            free(rows);
            return -1;
        }
        fputs("policy,index,model,arrival_s,prompt,output,state,ttft_s,e2e_s,swapped\n", c.dump);
    }
    int k = 0, rc = 0;
    for (int li = 0; li < nl && !rc; li++) {
        wl_req_t *reqs = NULL;
        size_t n = 0;
        double rate = 0;
        if (make_trace(a, &c, loads[li], &rate, &reqs, &n, err, errlen)) {
            rc = -1;
            break;
        }
        double *ml = NULL;
        if (a->hosts > 0 && model_loads(a, reqs, n, &ml)) {
            snprintf(err, errlen, "out of memory");
            rc = -1;
        }
        for (int pi = 0; pi < np && !rc; pi++, k++) {
            rows[k].load = loads[li];
            rows[k].rate = rate;
            rows[k].route = -1;
            if (a->hosts > 0) {
                simfleet_cfg_t fc = {.n_hosts = a->hosts,
                                     .route = routes[pi],
                                     .replicas = a->replicas,
                                     .balance_factor = a->balance_factor,
                                     .load = ml};
                rows[k].pol = SIM_POL_DEFAULT;
                rows[k].route = (int)routes[pi];
                rows[k].hosts = a->hosts;
                rc = simfleet_run(&c, &fc, reqs, n, &rows[k].r, &rows[k].host_models, err, errlen)
                         ? -1
                         : 0;
                continue;
            }
            rows[k].pol = pols[pi].pol;
            rows[k].lrub_n = pols[pi].n;
            rows[k].best = best[pi];
            rows[k].drop = pols[pi].drop;
            rows[k].host_models = c.n_models;
            if (best[pi]) {
                best_row(&rows[k], rows, k - pi, k);
                continue;
            }
            sim_cfg_t cp = c;
            cp.lru_batch_n = pols[pi].n;
            cp.deadline_drop = pols[pi].drop;
            rc = sim_run(&cp, pols[pi].pol, reqs, n, &rows[k].r, err, errlen) ? -1 : 0;
        }
        free(ml);
        free(reqs);
    }
    if (c.dump)
        fclose(c.dump);
    if (rc) {
        free(rows);
        return -1;
    }
    *out = rows;
    *n_out = k;
    return 0;
}

static const char *workload_name(const args_t *a, char *buf, size_t len)
{
    if (a->label)
        snprintf(buf, len, "%s", a->label);
    else if (a->requests)
        snprintf(buf, len, "requests");
    else if (a->llm_trace)
        snprintf(buf, len, "llm-trace");
    else if (a->trace)
        snprintf(buf, len, "azure");
    else
        snprintf(buf, len, "%s-zipf%.2g-m%d", a->arrival, a->zipf, a->models);
    if (a->lora_adapters > 0 && !a->label) {
        size_t l = strlen(buf);
        snprintf(buf + l, len - l, "-lora%d%s", a->lora_adapters, a->lora_merged ? "-merged" : "");
    }
    if (a->hosts > 0 && !a->label) {
        size_t l = strlen(buf);
        snprintf(buf + l, len - l, "-h%d", a->hosts);
    }
    return buf;
}

static void write_rows(FILE *f, const args_t *a, const row_t *rows, int n)
{
    char wl[128];
    workload_name(a, wl, sizeof wl);
    if (!a->no_header)
        fputs(csv_header, f);
    for (int i = 0; i < n; i++)
        csv_row(f, wl, &rows[i]);
}

/* ------------------------------------------------------------------ models per GPU */

/* p99 TTFT of policy ps with m models at a->mpg_rate req/s each (uniform,
 * --duration s of arrivals, seed a->seed + k); INFINITY when a request failed. */
static int mpg_try_seed(const args_t *a, const pol_spec_t *ps, int m, int k, double *p99, char *err,
                        size_t errlen)
{
    args_t b = *a;
    b.seed = a->seed + k;
    if (a->lora_adapters > 0)
        b.lora_adapters = m; /* the count searched: adapters (the other models stay) */
    else
        b.models = m;
    b.zipf = 0;
    sim_cfg_t c;
    build_cfg(&b, &c);
    wl_len_t pl = len_of(b.prompt_median, b.prompt_sigma, b.prompt_max);
    wl_len_t ol = len_of(b.output_median, b.output_sigma, b.output_max);
    int units = wl_units(&b);
    wl_params_t wp = {.n_models = units,
                      .zipf_s = 0,
                      .rate = a->mpg_rate * units,
                      .duration_s = b.duration,
                      .arrival = WL_ARRIVAL_POISSON,
                      .prompt = pl,
                      .output = ol,
                      .seed = (uint64_t)b.seed};
    wl_req_t *reqs = NULL;
    size_t n = 0;
    if (b.conversations) {
        if (conv_trace(&b, m, 0, wp.rate, (uint64_t)b.seed, &reqs, &n, err, errlen))
            return -1;
    } else if (wl_generate(&wp, &reqs, &n)) {
        snprintf(err, errlen, "cannot generate the workload");
        return -1;
    } else {
        tokens_from(&b, reqs, n);
        lora_map(&b, reqs, n);
    }
    c.lru_batch_n = ps->n;
    sim_result_t r;
    int rc = sim_run(&c, ps->pol, reqs, n, &r, err, errlen);
    free(reqs);
    if (rc)
        return -1;
    *p99 = r.completed == r.requests ? r.ttft_p99 : INFINITY;
    return 0;
}

/* The worst p99 TTFT over --mpg-seeds seeds (one 300 s run's p99 is its
 * 20th-worst request or so: near the limit a seed moves it by 20-40%). */
static int mpg_try(const args_t *a, const pol_spec_t *ps, int m, double *p99, char *err,
                   size_t errlen)
{
    int seeds = a->mpg_seeds > 0 ? a->mpg_seeds : 1;
    *p99 = 0;
    for (int k = 0; k < seeds; k++) {
        double p;
        if (mpg_try_seed(a, ps, m, k, &p, err, errlen))
            return -1;
        if (p > *p99)
            *p99 = p;
        if (*p99 > a->slo_ttft)
            break; /* the count fails: the other seeds cannot bring it back */
    }
    return 0;
}

/* Per policy: the most models within the TTFT target, by bisection over
 * multiples of mpg_step (p99 TTFT taken to grow with the model count). */
static int models_per_gpu(const args_t *a)
{
    char err[512];
    args_t top = *a; /* the largest count, for lru-batch's N */
    if (a->lora_adapters > 0)
        top.lora_adapters = a->mpg_max;
    else
        top.models = a->mpg_max;
    sim_cfg_t c;
    build_cfg(&top, &c);
    pol_spec_t specs[MAX_POLS], pols[MAX_POLS];
    int best[MAX_POLS], ns, np;
    if (parse_policies(a->policies, specs, &ns)) {
        fprintf(stderr, "tracesim: bad --policies\n");
        return 2;
    }
    FILE *f = a->csv ? fopen(a->csv, a->append ? "a" : "w") : stdout;
    if (!f) {
        fprintf(stderr, "tracesim: cannot write %s\n", a->csv);
        return 1;
    }
    if (!a->no_header)
        fputs("workload,policy,models,ttft_p99_s,next_models,next_ttft_p99_s\n", f);
    int step = a->mpg_step > 0 ? a->mpg_step : 1;
    int hi_k = a->mpg_max / step, rc = 0;
    char wl[128];
    snprintf(wl, sizeof wl, "%s", a->label ? a->label : "models-per-gpu");
    for (int si = 0; si < ns && !rc; si++) {
        /* lru-batch without N: every N the pool holds at the largest count, the best reported */
        pol_spec_t one[1] = {specs[si]};
        if (expand_policies(one, 1, &c, pols, best, &np)) {
            rc = 1;
            break;
        }
        int best_k = 0;
        double best_p99 = NAN, best_next = NAN;
        int have = 0;
        row_t nm = {0};
        for (int pi = 0; pi < np && !rc; pi++) {
            if (best[pi] || pols[pi].pol == SIM_POL_BELADY)
                continue;
            /* largest k with p99(k * step) within target: lo passes (0 trivially), hi fails */
            int lo = 0, hi = hi_k + 1;
            double p_lo = 0, p_hi = INFINITY;
            while (hi - lo > 1) {
                int mid = (lo + hi) / 2;
                double p;
                if (mpg_try(a, &pols[pi], mid * step, &p, err, sizeof err)) {
                    fprintf(stderr, "tracesim: %s\n", err);
                    rc = 1;
                    break;
                }
                if (p <= a->slo_ttft)
                    lo = mid, p_lo = p;
                else
                    hi = mid, p_hi = p;
            }
            nm.pol = pols[pi].pol;
            nm.lrub_n = pols[pi].n;
            nm.route = -1;
            if (!a->quiet)
                fprintf(stderr, "%-16s %4d models (p99 TTFT %.3f s), %d: %.3f s\n", row_name(&nm),
                        lo * step, p_lo, hi * step, p_hi);
            fprintf(f, "%s,%s,%d,%.6f,%d,%.6f\n", wl, row_name(&nm), lo * step, p_lo, hi * step,
                    p_hi);
            if (!have || lo > best_k) {
                have = 1;
                best_k = lo;
                best_p99 = p_lo;
                best_next = p_hi;
            }
        }
        if (np > 1 && !rc)
            fprintf(f, "%s,%s-best,%d,%.6f,%d,%.6f\n", wl,
                    specs[si].pol == SIM_POL_LORA_SLOTS ? "lora-slots" : "lru-batch", best_k * step,
                    best_p99, (best_k + 1) * step, best_next);
    }
    if (f != stdout)
        fclose(f);
    return rc;
}

/* ------------------------------------------------------------------ self-test */

static int n_pass, n_fail;

static void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s ", ok ? "ok  " : "FAIL");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    if (ok)
        n_pass++;
    else
        n_fail++;
}

/* CSV of a run as a string (malloc'ed). */
static char *rows_csv(const args_t *a, const row_t *rows, int n)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    write_rows(f, a, rows, n);
    fclose(f);
    return buf;
}

static const row_t *find_row(const row_t *rows, int n, sim_policy_t p, double load)
{
    for (int i = 0; i < n; i++)
        if (rows[i].pol == p && rows[i].load == load)
            return &rows[i];
    return NULL;
}

/* Checks that hold for any policy run on any trace. */
static void check_rows(const char *what, const row_t *rows, int n)
{
    for (int i = 0; i < n; i++) {
        const row_t *w = &rows[i];
        const sim_result_t *r = &w->r;
        const row_t *bel = find_row(rows, n, SIM_POL_BELADY, w->load);
        if (w->pol == SIM_POL_BELADY || w->best)
            continue;
        const char *pn = sim_policy_name(w->pol);
        check(r->violations == 0 && r->max_mapped_pages <= r->pool_pages,
              "%s load %.3g %s: pool never over-committed (%llu of %llu pages at most, %llu "
              "violations)",
              what, w->load, pn, (unsigned long long)r->max_mapped_pages,
              (unsigned long long)r->pool_pages, (unsigned long long)r->violations);
        check(r->completed == r->requests, "%s load %.3g %s: every request completes (%zu/%zu)",
              what, w->load, pn, r->completed, r->requests);
        check(r->active_left == 0, "%s load %.3g %s: no sequence left counted active (%llu)", what,
              w->load, pn, (unsigned long long)r->active_left);
        check(r->belady_own <= r->model_loads,
              "%s load %.3g %s: Belady on its own order of model uses (%llu) <= its model "
              "loads (%llu)",
              what, w->load, pn, (unsigned long long)r->belady_own,
              (unsigned long long)r->model_loads);
        /* fifo and lru serve in arrival order, so Belady on that order bounds them */
        if (bel && (w->pol == SIM_POL_FIFO || w->pol == SIM_POL_LRU))
            check(bel->r.model_loads <= r->model_loads,
                  "%s load %.3g %s: Belady on the arrival order (%llu) <= its model loads (%llu)",
                  what, w->load, pn, (unsigned long long)bel->r.model_loads,
                  (unsigned long long)r->model_loads);
        check(r->model_loads <= r->page_ins && r->bytes_in >= r->page_ins,
              "%s load %.3g %s: loads, page-ins and bytes consistent", what, w->load, pn);
    }
}

static void test_units(void)
{
    /* Belady on a textbook sequence: 7 0 1 2 0 3 0 4 2 3 0 3 2 with 3 frames -> 7 faults
     * (Silberschatz's example, models 0..7) */
    static const int seq[] = {7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1};
    check(sim_belady(seq, 20, 8, 3) == 9, "Belady: the textbook reference string takes 9 loads");
    check(sim_belady(seq, 20, 8, 8) == 6, "Belady: with room for all, one load per model");
    /* virtual copy queue: FIFO, bandwidth */
    vb_cfg_t vc = {.pool_bytes = 8 << 20, .page_size = 1 << 20, .h2d_bw = 1e9, .copy_lat_s = 0};
    vb_t *vb = vb_new(&vc);
    backend_t *be = vb_backend(vb);
    void *base;
    be_event_t *e1, *e2;
    be->reserve(be->ctx, 4 << 20, &base);
    be->event_new(be->ctx, &e1);
    be->event_new(be->ctx, &e2);
    int mapped = be->map(be->ctx, base, 0, 4 << 20) == 0;
    be->copy_h2d(be->ctx, base, (void *)(uintptr_t)4096, 1000000, e1);
    be->copy_h2d(be->ctx, (char *)base + (1 << 20), (void *)(uintptr_t)4096, 1000000, e2);
    int pending = be->event_done(be->ctx, e2) == 0;
    be->wait(be->ctx, e2);
    check(mapped && pending && fabs(vb_now(vb) - 2e-3) < 1e-12 && be->event_done(be->ctx, e1),
          "virtual device: copies run one after another at the set bandwidth");
    void *b2;
    be->reserve(be->ctx, 8 << 20, &b2);
    int over = be->map(be->ctx, b2, 0, 8 << 20) != 0;
    vb_stats_t st;
    vb_get_stats(vb, &st);
    check(over && st.violations == 1 && st.mapped_pages == 4,
          "virtual device: a map past the pool is refused and counted");
    be->unmap(be->ctx, base, 0, 4 << 20);
    be->release(be->ctx, base, 4 << 20);
    be->release(be->ctx, b2, 8 << 20);
    be->event_free(be->ctx, e1);
    be->event_free(be->ctx, e2);
    vb_free(vb);
    /* workload distributions */
    wl_params_t wp = {.n_models = 4,
                      .zipf_s = 1.0,
                      .rate = 100,
                      .duration_s = 200,
                      .arrival = WL_ARRIVAL_GAMMA,
                      .cv = 3,
                      .prompt = {100, 0.5, 1, 1000},
                      .output = {50, 0, 1, 100},
                      .seed = 3};
    wl_req_t *r = NULL;
    size_t n = 0;
    int ok = wl_generate(&wp, &r, &n) == 0;
    size_t cnt[4] = {0};
    double s1 = 0, s2 = 0;
    for (size_t i = 0; ok && i < n; i++) {
        cnt[r[i].model]++;
        double g = r[i].t - (i ? r[i - 1].t : 0);
        s1 += g;
        s2 += g * g;
    }
    double mean = s1 / n, cv = sqrt(s2 / n - mean * mean) / mean;
    check(ok && n > 15000 && n < 25000 && cnt[0] > cnt[1] && cnt[1] > cnt[2] && cnt[2] > cnt[3] &&
              fabs((double)cnt[0] / cnt[1] - 2.0) < 0.3,
          "workload: Zipf(1) popularity (%zu %zu %zu %zu)", cnt[0], cnt[1], cnt[2], cnt[3]);
    check(fabs(cv - 3.0) < 0.5, "workload: Gamma inter-arrival CV %.2f ~ 3", cv);
    free(r);
}

/* Writes text to path; 1 if it was written. */
static int write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return 0;
    int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

/* The recorded-request format: read back, refused when malformed, simulated. */
static void test_requests(const args_t *base)
{
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/tracesim-requests-%d.txt", base->self_test_dir, (int)getpid());
    int written = write_text(path, "# arrival_s model prompt_tokens output_tokens\n0.5 1 32 8\n"
                                   "\n1.0 0 16 4 # warm\n1.0 1 8 2\n");
    wl_req_t *r = NULL;
    size_t n = 0;
    int ok = written && wl_requests_read(path, 2, &r, &n, err, sizeof err) == 0;
    check(ok && n == 3 && r[0].t == 0.5 && r[0].model == 1 && r[0].prompt == 32 &&
              r[0].output == 8 && r[1].model == 0 && r[2].output == 2,
          "request list read back: %zu requests, comments and blank lines skipped", n);
    sim_cfg_t c;
    build_cfg(base, &c);
    c.n_models = 2;
    sim_result_t res;
    ok = ok && sim_run(&c, SIM_POL_DEFAULT, r, n, &res, err, sizeof err) == 0;
    check(ok && res.completed == 3 && res.model_loads == 2,
          "request list simulated: %zu of 3 complete, %llu model loads", ok ? res.completed : 0,
          ok ? (unsigned long long)res.model_loads : 0);
    free(r);
    /* a prompt plus output past the context is refused, as the daemon does */
    wl_req_t big = {.t = 0, .model = 0, .prompt = c.max_context, .output = 1};
    ok = sim_run(&c, SIM_POL_DEFAULT, &big, 1, &res, err, sizeof err) == 0;
    check(ok && res.failed == 1 && res.page_ins == 0,
          "a request past the context fails at submission without paging anything");
    static const char *const bad[] = {"0.5 2 8 8\n", "0.5 0 0 8\n", "1 0 8 8\n0.5 0 8 8\n",
                                      "0.5 0 8\n", "0.5 0 8 8 9\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(path, bad[i]);
        r = NULL;
        int rc = wl_requests_read(path, 2, &r, &n, err, sizeof err);
        free(r);
        check(rc == WL_ERR_FORMAT, "request list refused: %s", err);
    }
    remove(path);
}

/* The LLM request trace format: arrivals from the first, token counts kept
 * (cut to the context), models a seeded Zipf draw; a bad file is refused. */
static void test_llm_trace(const args_t *base)
{
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/tracesim-llm-%d.csv", base->self_test_dir, (int)getpid());
    int written = write_text(path, "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                   "2023-11-16 23:59:59.5000000,100,10\n"
                                   "2023-11-17 00:00:01.0000000,7000,0\n"
                                   "2023-11-17 00:00:03.5000000,20,5000\n");
    wl_llm_trace_t lt = {.n_models = 4, .zipf_s = 1.0, .time_scale = 2, .max_ctx = 4096, .seed = 1};
    wl_req_t *r = NULL;
    size_t n = 0;
    int ok = written && wl_llm_trace_read(path, &lt, &r, &n, err, sizeof err) == 0;
    check(ok && n == 3 && r[0].t == 0 && fabs(r[1].t - 0.75) < 1e-9 && fabs(r[2].t - 2.0) < 1e-9 &&
              r[0].prompt == 100 && r[0].output == 10 && r[1].output == 1 && r[1].prompt == 4095 &&
              r[2].output == 2048 && r[2].prompt == 20,
          "LLM trace read back: arrivals across midnight from the first (time / 2), zero "
          "output counted as 1, prompt + output cut to the context%s%s",
          ok ? "" : ": ", ok ? "" : err);
    int in_range = ok;
    for (size_t i = 0; ok && i < n; i++)
        in_range &= r[i].model >= 0 && r[i].model < 4;
    wl_req_t *r2 = NULL;
    size_t n2 = 0;
    int same = ok && wl_llm_trace_read(path, &lt, &r2, &n2, err, sizeof err) == 0 && n2 == n;
    for (size_t i = 0; same && i < n; i++)
        same = r2[i].model == r[i].model;
    check(in_range && same, "LLM trace: models drawn in range, the same for the same seed");
    /* --tokens-from: synthetic arrivals keep their times and models, their
     * token counts are pairs of the trace's, the same for the same seed */
    wl_req_t syn[64], syn2[64];
    for (int i = 0; i < 64; i++)
        syn[i] = syn2[i] = (wl_req_t){.t = i, .model = i % 3, .prompt = 1, .output = 1};
    if (ok) {
        wl_tokens_draw(syn, 64, r, n, 7);
        wl_tokens_draw(syn2, 64, r, n, 7);
    }
    int pairs = ok, kept = 1, seen = 0;
    for (int i = 0; ok && i < 64; i++) {
        int from = -1;
        for (size_t j = 0; j < n; j++)
            if (syn[i].prompt == r[j].prompt && syn[i].output == r[j].output)
                from = (int)j;
        pairs &= from >= 0 && syn2[i].prompt == syn[i].prompt && syn2[i].output == syn[i].output;
        kept &= syn[i].t == i && syn[i].model == i % 3;
        seen |= from >= 0 ? 1 << from : 0;
    }
    check(pairs && kept && seen == 7,
          "--tokens-from: 64 synthetic requests take token pairs of the trace (all 3 drawn), "
          "seeded; arrivals and models kept");
    free(r);
    free(r2);
    static const char *const bad[] = {
        "TIMESTAMP,Context,Generated\n",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,12\n",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.5,12,3\n2023-11-16 18:17:02.5,12,3\n",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(path, bad[i]);
        r = NULL;
        int rc = wl_llm_trace_read(path, &lt, &r, &n, err, sizeof err);
        free(r);
        check(rc == WL_ERR_FORMAT, "LLM trace refused: %s", err);
    }
    remove(path);
}

/* lru and lru-batch admit a model's pending requests in one step; when the
 * KV caches of only some of them fit, the admitted list must end there (the
 * rest stay pending, and the active counts match the lists). */
static void test_partial_admit(const args_t *base)
{
    char err[512];
    args_t a = *base;
    a.models = 2;
    a.pool_models = 1;
    a.kv_headroom_gib = 0.6; /* KV for one or two 2000-token prompts (F32 or F16), not four */
    sim_cfg_t c;
    build_cfg(&a, &c);
    wl_req_t rq[8];
    for (int i = 0; i < 8; i++)
        rq[i] = (wl_req_t){.t = 1.0 + (i >= 4) * 0.5, .model = i >= 4, .prompt = 2000, .output = 8};
    static const sim_policy_t pols[] = {SIM_POL_LRU, SIM_POL_LRU_BATCH};
    for (size_t p = 0; p < sizeof pols / sizeof pols[0]; p++) {
        sim_result_t r;
        c.lru_batch_n = 1;
        int ok = sim_run(&c, pols[p], rq, 8, &r, err, sizeof err) == 0;
        check(ok && r.completed == 8 && r.failed == 0 && r.active_left == 0 && r.violations == 0,
              "%s: four requests whose KV caches do not all fit at once are admitted in parts, "
              "all complete (%zu of 8, %zu failed, %llu left active)%s%s",
              sim_policy_name(pols[p]), ok ? r.completed : 0, ok ? r.failed : 0,
              ok ? (unsigned long long)r.active_left : 0, ok ? "" : ": ", ok ? "" : err);
    }
}

/* Conversations: the prefix cache prefills a fraction of what prefilling every history does,
 * and with a pool too small to keep it, the host tier turns its reclaims into restores. */
static void test_conversations(const args_t *base)
{
    char err[512];
    args_t a = *base;
    a.conversations = 1;
    a.models = 4;
    a.zipf = 0;
    a.rate = 0;
    a.load = 0.05; /* light: a turn's reply lands well before the next turn */
    a.duration = 60;
    a.turns = 8;
    a.think_s = 5;
    a.sweep = NULL;
    a.policies = "default";
    a.max_context = 8192;
    a.label = "conv";
    a.pool_models = 5; /* every model resident: cached KV goes only for KV */
    sim_result_t r[PFX_MODES];
    int ok = 1;
    for (int k = 0; k < PFX_MODES && ok; k++) {
        row_t *rows = NULL;
        int n = 0;
        a.pfx_mode = k;
        ok = run_all(&a, &rows, &n, err, sizeof err) == 0 && n == 1;
        if (ok) {
            r[k] = rows[0].r;
            check_rows(pfx_names[k], rows, n);
        }
        free(rows);
    }
    check(ok, "conversations run with the prefix cache off, on and with the host tier%s%s",
          ok ? "" : ": ", ok ? "" : err);
    if (!ok)
        return;
    check(r[PFX_OFF].prefill_tokens == r[PFX_OFF].prompt_tokens && r[PFX_OFF].pfx_hit_tokens == 0,
          "conversations, no prefix cache: every prompt token prefilled (%llu)",
          (unsigned long long)r[PFX_OFF].prefill_tokens);
    check(r[PFX_ON].prefill_tokens * 3 < r[PFX_OFF].prefill_tokens && r[PFX_ON].pfx_hit_tokens > 0,
          "conversations, prefix cache: %llu prompt tokens prefilled against %llu without "
          "(%llu reused)",
          (unsigned long long)r[PFX_ON].prefill_tokens,
          (unsigned long long)r[PFX_OFF].prefill_tokens,
          (unsigned long long)r[PFX_ON].pfx_hit_tokens);
    /* a pool of 2.2 models for 4: a model paged in reclaims the others' cached KV */
    a.pool_models = 2.2;
    a.kv_headroom_gib = 0;
    a.kv_host = (size_t)8 << 30;
    for (int k = PFX_ON; k <= PFX_HOST && ok; k++) {
        row_t *rows = NULL;
        int n = 0;
        a.pfx_mode = k;
        ok = run_all(&a, &rows, &n, err, sizeof err) == 0 && n == 1;
        if (ok) {
            r[k] = rows[0].r;
            check_rows(pfx_names[k], rows, n);
        }
        free(rows);
    }
    check(ok && r[PFX_ON].kv_device_drops > 0 && r[PFX_ON].kv_restores == 0,
          "conversations, a small pool without a host tier: cached KV reclaimed and lost (%llu)",
          ok ? (unsigned long long)r[PFX_ON].kv_device_drops : 0ULL);
    check(ok && r[PFX_HOST].kv_demotions > 0 && r[PFX_HOST].kv_restores > 0 &&
              r[PFX_HOST].prefill_tokens < r[PFX_ON].prefill_tokens,
          "conversations, a small pool with a host tier: %llu reclaims copied to host RAM, %llu "
          "restores (%llu tokens); %llu prompt tokens prefilled against %llu without it",
          ok ? (unsigned long long)r[PFX_HOST].kv_demotions : 0ULL,
          ok ? (unsigned long long)r[PFX_HOST].kv_restores : 0ULL,
          ok ? (unsigned long long)r[PFX_HOST].kv_restore_tokens : 0ULL,
          ok ? (unsigned long long)r[PFX_HOST].prefill_tokens : 0ULL,
          ok ? (unsigned long long)r[PFX_ON].prefill_tokens : 0ULL);
}

static int self_test(const args_t *base)
{
    char err[512];
    test_units();
    /* a small default-shaped workload, all policies, twice */
    args_t a = *base;
    a.duration = 60;
    a.sweep = "0.3,0.6";
    a.policies = "default,fifo,lru,lru-batch,belady";
    a.csv = NULL;
    a.label = "selftest";
    row_t *r1 = NULL, *r2 = NULL;
    int n1 = 0, n2 = 0;
    int ok =
        run_all(&a, &r1, &n1, err, sizeof err) == 0 && run_all(&a, &r2, &n2, err, sizeof err) == 0;
    check(ok, "synthetic runs succeed%s%s", ok ? "" : ": ", ok ? "" : err);
    if (ok) {
        char *c1 = rows_csv(&a, r1, n1), *c2 = rows_csv(&a, r2, n2);
        check(c1 && c2 && strcmp(c1, c2) == 0, "determinism: the same seed gives the same CSV");
        args_t b = a;
        b.seed = a.seed + 1;
        row_t *r3 = NULL;
        int n3 = 0;
        char *c3 = run_all(&b, &r3, &n3, err, sizeof err) == 0 ? rows_csv(&b, r3, n3) : NULL;
        check(c3 && strcmp(c1, c3) != 0, "another seed gives another CSV");
        free(c1);
        free(c2);
        free(c3);
        free(r3);
        check_rows("synthetic", r1, n1);
    }
    free(r1);
    free(r2);
    /* a cold first request: the page-in runs in the background and the pass
     * starts once the copies left are covered by the compute ahead of them;
     * with no compute measured yet for the model that is when they have
     * landed: the copy plus one pass (1% for the loop polling the copies) */
    {
        sim_cfg_t c;
        build_cfg(base, &c);
        wl_req_t one = {.t = 1.0, .model = 0, .prompt = 16, .output = 1};
        sim_result_t r;
        ok = sim_run(&c, SIM_POL_DEFAULT, &one, 1, &r, err, sizeof err) == 0;
        double copy = (double)sim_model_bytes(&c.shape, c.page_size) / c.cost.h2d_bw +
                      (c.shape.n_layer + 2) * c.cost.copy_lat_s;
        double pass = sim_step_time(&c, 16, 1, 16);
        check(ok && r.ttft_p50 >= copy && r.ttft_p50 < (copy + pass) * 1.01,
              "page-in off the critical path: cold TTFT %.4f s is the copy %.4f s plus one pass "
              "%.4f s",
              r.ttft_p50, copy, pass);
        check(ok && r.page_ins == c.shape.n_layer + 2u && r.model_loads == 1,
              "a cold request pages every segment in once");
    }
    /* LoRA adapters: an adapter's size from the base's shape; units to adapters and models; one
     * slot holds two adapters' sequences apart, two let them share the passes */
    {
        const sim_shape_t *b8 = &mix_table[1].sh; /* 8b: q 4096, k and v 1024 wide */
        double want = 32.0 * 16 * ((4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096));
        check(sim_lora_params(b8, 16, SIM_LORA_Q | SIM_LORA_K | SIM_LORA_V | SIM_LORA_O) == want,
              "LoRA: rank 16 on q, k, v, o of the 8B shape is %.0f parameters", want);
        args_t la = *base;
        la.models = 2;
        la.lora_adapters = 3;
        wl_req_t u[4] = {{.model = 0}, {.model = 1}, {.model = 2}, {.model = 3}};
        lora_map(&la, u, 4);
        check(u[0].model == 0 && u[0].adapter == 1 && u[2].model == 0 && u[2].adapter == 3 &&
                  u[3].model == 1 && u[3].adapter == 0 && wl_units(&la) == 4,
              "LoRA: the units are adapters 1..3 of model 0, then model 1");
        la.models = 1;
        la.lora_adapters = 2;
        sim_cfg_t c;
        build_cfg(&la, &c);
        wl_req_t two[2] = {{.t = 1, .model = 0, .prompt = 16, .output = 8, .adapter = 1},
                           {.t = 1, .model = 0, .prompt = 16, .output = 8, .adapter = 2}};
        sim_result_t r1, r2;
        c.lru_batch_n = 1;
        ok = sim_run(&c, SIM_POL_LORA_SLOTS, two, 2, &r1, err, sizeof err) == 0;
        c.lru_batch_n = 2;
        ok = ok && sim_run(&c, SIM_POL_LORA_SLOTS, two, 2, &r2, err, sizeof err) == 0;
        check(ok && r1.completed == 2 && r2.completed == 2 && r1.lora_loads == 2 &&
                  r2.lora_loads == 2 && r1.steps == 16 && r2.steps == 8 && r1.e2e_max > r2.e2e_max,
              "lora-slots: one slot runs two adapters one after the other (%llu steps, e2e %.3f "
              "s), two together (%llu, %.3f s)",
              (unsigned long long)r1.steps, r1.e2e_max, (unsigned long long)r2.steps, r2.e2e_max);
    }
    /* the Azure format: write a sample, read it back, simulate it */
    char path[512];
    snprintf(path, sizeof path, "%s/tracesim-azure-sample-%d.csv", base->self_test_dir,
             (int)getpid());
    ok = wl_azure_write_sample(path, 24, 60, 11) == 0;
    check(ok, "Azure sample written to %s", path);
    wl_azure_t az = {.n_models = 12,
                     .start_min = 0,
                     .n_min = 10,
                     .time_scale = 1,
                     .prompt = {256, 0.8, 1, 2048},
                     .output = {96, 0.8, 1, 512},
                     .seed = 1};
    wl_req_t *reqs = NULL;
    size_t n = 0;
    ok = ok && wl_azure_read(path, &az, &reqs, &n, err, sizeof err) == 0;
    int sorted = 1, in_range = 1;
    for (size_t i = 0; ok && i < n; i++) {
        sorted &= i == 0 || reqs[i].t >= reqs[i - 1].t;
        in_range &= reqs[i].model >= 0 && reqs[i].model < 12 && reqs[i].t < 600;
    }
    check(ok && n > 100 && sorted && in_range,
          "Azure trace read back: %zu requests in 10 "
          "minutes, sorted, mapped to 12 models",
          n);
    /* the busiest function is model 0 */
    size_t cnt[12] = {0};
    for (size_t i = 0; ok && i < n; i++)
        cnt[reqs[i].model]++;
    int top = 1;
    for (int m = 1; m < 12; m++)
        top &= cnt[0] >= cnt[m];
    check(ok && top, "Azure trace: the top function by volume is model 0");
    free(reqs);
    FILE *bad = fopen(path, "r+");
    if (bad) {
        fputs("HashOwnr", bad);
        fclose(bad);
    }
    check(wl_azure_read(path, &az, &reqs, &n, err, sizeof err) == WL_ERR_FORMAT,
          "Azure reader refuses a bad header (%s)", err);
    wl_azure_write_sample(path, 24, 60, 11);
    a = *base;
    a.trace = path;
    a.trace_minutes = 10;
    a.trace_scale = 4;
    a.sweep = NULL;
    a.policies = "default,fifo,lru,lru-batch,belady";
    a.label = "azure-sample";
    row_t *ra = NULL;
    int na = 0;
    ok = run_all(&a, &ra, &na, err, sizeof err) == 0;
    check(ok, "simulation of the Azure sample%s%s", ok ? "" : ": ", ok ? "" : err);
    if (ok)
        check_rows("azure", ra, na);
    free(ra);
    remove(path);
    test_requests(base);
    test_partial_admit(base);
    test_llm_trace(base);
    test_conversations(base);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

/* The policies side by side for one --prefix-cache mode: CSV and the summary table. */
static int run_rows(const args_t *a)
{
    char err[512];
    row_t *rows = NULL;
    int rc = 0;
    int n = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (run_all(a, &rows, &n, err, sizeof err)) {
        fprintf(stderr, "tracesim: %s\n", err);
        rc = 1;
        goto out;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    FILE *f = a->csv ? fopen(a->csv, a->append ? "a" : "w") : stdout;
    if (!f) {
        fprintf(stderr, "tracesim: cannot write %s\n", a->csv);
        rc = 1;
        goto out;
    }
    write_rows(f, a, rows, n);
    if (f != stdout)
        fclose(f);
    if (!a->quiet) {
        sim_cfg_t c;
        build_cfg(a, &c);
        char wl[128];
        size_t img =
            a->files ? sim_models_image_bytes(a->files, 0) : sim_model_bytes(&c.shape, c.page_size);
        fprintf(stderr,
                "%s: %d models of %.4g GB (%u segments), %d host%s, pool %.4g GB "
                "(%llu pages) and ideal capacity %.2f req/s a host; %.1f s wall\n",
                workload_name(a, wl, sizeof wl), c.n_models, img / 1e9, c.shape.n_layer + 2,
                a->hosts > 0 ? a->hosts : 1, a->hosts > 1 ? "s" : "", c.pool_bytes / 1e9,
                (unsigned long long)(c.pool_bytes / c.page_size), capacity(a, &c),
                (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
        if (a->lora_adapters > 0 && !a->lora_merged)
            fprintf(stderr,
                    "LoRA: %d adapters on model 0, rank %u on %s: %.4g M parameters, %.4g MB "
                    "each, %.4g GB all of them\n",
                    a->lora_adapters, a->lora_rank, a->lora_targets, c.lora_params / 1e6,
                    c.lora_bytes / 1e6, c.lora_bytes * a->lora_adapters / 1e9);
        for (int i = 0; i < (c.n_shapes ? c.n_shapes : 1); i++) {
            const sim_shape_t *sh = sim_cfg_shape(&c, i);
            double tot, act;
            if (!sh->n_expert)
                continue; /* dense: the line above says it all */
            sim_shape_params(sh, &tot, &act);
            fprintf(stderr,
                    "mixture of experts (model %d): %.3g B parameters paged in (%.4g GB), %.3g B "
                    "active: a one-token step reads %.4g GB, a step of %u tokens %.4g GB\n",
                    i, tot / 1e9, sim_model_bytes(sh, c.page_size) / 1e9, act / 1e9,
                    sim_step_read(sh, 1) / 1e9, c.max_batch, sim_step_read(sh, c.max_batch) / 1e9);
        }
        table_head(stderr);
        for (int i = 0; i < n; i++)
            table_row(stderr, &rows[i]);
        for (int i = 0; i < n; i++)
            if (rows[i].pol == SIM_POL_LORA_SLOTS && !rows[i].best)
                fprintf(stderr, "%-14s %llu adapter copies into slots\n", row_name(&rows[i]),
                        (unsigned long long)rows[i].r.lora_loads);
        for (int i = 0; i < n && a->conversations; i++) {
            const sim_result_t *r = &rows[i].r;
            fprintf(stderr,
                    "%-12s prefill %llu of %llu prompt tokens (%.1f%%); reused %llu from the "
                    "device, %llu restored (%llu restores); %llu demoted, %llu dropped (pool), "
                    "%llu dropped (host), %llu host copies prefilled instead\n",
                    row_name(&rows[i]), (unsigned long long)r->prefill_tokens,
                    (unsigned long long)r->prompt_tokens,
                    r->prompt_tokens ? 100.0 * r->prefill_tokens / r->prompt_tokens : 0.0,
                    (unsigned long long)r->pfx_hit_tokens, (unsigned long long)r->kv_restore_tokens,
                    (unsigned long long)r->kv_restores, (unsigned long long)r->kv_demotions,
                    (unsigned long long)r->kv_device_drops, (unsigned long long)r->kv_host_drops,
                    (unsigned long long)r->kv_host_recomputes);
        }
    }
out:
    free(rows);
    return rc;
}

/* Each --prefix-cache mode in turn (conversations), labelled -off, -on, -host when there are
 * several, one CSV (appended after the first). */
static int run_modes(const args_t *a)
{
    char buf[512], label[160];
    snprintf(buf, sizeof buf, "%s", a->conversations ? a->prefix_cache : "off");
    int first = 1, rc = 0, several = strchr(buf, ',') != NULL;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && !rc;
         t = strtok_r(NULL, ",", &save)) {
        args_t b = *a;
        b.pfx_mode = -1;
        for (int k = 0; k < PFX_MODES; k++)
            if (strcmp(t, pfx_names[k]) == 0)
                b.pfx_mode = k;
        if (b.pfx_mode < 0) {
            fprintf(stderr, "tracesim: bad --prefix-cache '%s' (off, on, host)\n", t);
            return 2;
        }
        if (several) {
            char wl[128];
            if (a->mpg_rate > 0)
                snprintf(wl, sizeof wl, "%s", a->label ? a->label : "models-per-gpu");
            else
                workload_name(a, wl, sizeof wl);
            snprintf(label, sizeof label, "%s-%s", wl, t);
            b.label = label;
        }
        if (!first) {
            b.no_header = 1;
            b.append = 1;
        }
        if (!a->quiet && several)
            fprintf(stderr, "== prefix cache %s\n", t);
        rc = b.mpg_rate > 0 ? models_per_gpu(&b) : run_rows(&b);
        first = 0;
    }
    return rc;
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv)
{
    args_t a;
    if (parse_args(&a, argc, argv)) {
        usage(stderr);
        args_free(&a);
        return 2;
    }
    int rc = 0;
    char err[512];
    row_t *rows = NULL;
    if (a.help) {
        usage(stdout);
        goto done;
    }
    if (a.write_sample) {
        if (wl_azure_write_sample(a.write_sample, 24, 60, (uint64_t)a.seed)) {
            fprintf(stderr, "tracesim: cannot write %s\n", a.write_sample);
            rc = 1;
        }
        goto done;
    }
    if (a.costs) {
        sim_cost_t k = {.t_fixed_s = a.t_fixed_ms * 1e-3};
        costs_src_t src;
        if (costs_load(a.costs, &k, &src, err, sizeof err)) {
            fprintf(stderr, "tracesim: --costs: %s\n", err);
            rc = 1;
            goto done;
        }
        a.h2d_gbs = k.h2d_bw / 1e9;
        a.hbm_gbs = k.hbm_bw / 1e9;
        a.tflops = k.flops / 1e12;
        a.t_fixed_ms = k.t_fixed_s * 1e3;
        a.t_step_ms = k.t_step_s * 1e3;
        a.t_token_ms = k.t_token_s * 1e3;
        fprintf(
            stderr,
            "tracesim: costs from %s: %d of 4 figures measured\n"
            "  host->device %.4g GB/s: %s\n  HBM %.4g GB/s: %s\n  step: %s\n  matmul %.4g TFLOP/s: %s\n",
            strcmp(a.costs, "h200") ? a.costs : "the H200 datasheet", src.n_measured, a.h2d_gbs,
            src.h2d, a.hbm_gbs, src.hbm, src.step, a.tflops, src.flops);
    }
    if (a.print_costs) {
        printf(
            "h2d_gbs=%.6g hbm_gbs=%.6g tflops=%.6g t_fixed_ms=%.6g t_step_ms=%.6g t_token_ms=%.6g\n",
            a.h2d_gbs, a.hbm_gbs, a.tflops, a.t_fixed_ms, a.t_step_ms, a.t_token_ms);
        goto done;
    }
    if (a.mix && (parse_mix(&a) || a.pool_gib <= 0 || a.n_gguf)) {
        fprintf(
            stderr,
            "tracesim: bad --mix '%s' (3b, 8b, 70b, 30b-a3b with -q4 or -bf16; needs --pool-gib, "
            "no --gguf)\n",
            a.mix);
        rc = 2;
        goto done;
    }
    if (a.experts && (a.experts_used < 1 || a.experts_used > a.experts || a.expert_ff < 1)) {
        fprintf(stderr, "tracesim: --experts-used must be 1..--experts (%u), --expert-ff > 0\n",
                a.experts);
        rc = 2;
        goto done;
    }
    if (a.models <= 0)
        a.models = a.n_gguf ? a.n_gguf : a.hosts > 0 ? 10 * a.hosts : 12;
    if (a.lora_adapters < 0 ||
        (a.lora_adapters > 0 &&
         (a.n_gguf || a.hosts > 0 || a.trace || a.requests || a.conversations || a.lora_rank < 1 ||
          a.experts || !lora_targets(a.lora_targets)))) {
        fprintf(stderr, "tracesim: --lora-adapters needs a dense model shape (no --gguf, "
                        "--experts), synthetic arrivals or --llm-trace (no --hosts, --trace, "
                        "--requests, --conversations), --lora-rank >= 1 and --lora-targets of q, "
                        "k, v, o, gate, up, down\n");
        rc = 2;
        goto done;
    }
    if (a.tokens_from) {
        if (a.trace || a.requests || a.llm_trace) {
            fprintf(stderr, "tracesim: --tokens-from is for synthetic arrivals (not with --trace, "
                            "--requests or --llm-trace)\n");
            rc = 2;
            goto done;
        }
        wl_llm_trace_t lt = {.n_models = 1, .time_scale = 1, .max_ctx = a.max_context};
        if (wl_llm_trace_read(a.tokens_from, &lt, &a.tok, &a.n_tok, err, sizeof err)) {
            fprintf(stderr, "tracesim: --tokens-from: %s\n", err);
            rc = 1;
            goto done;
        }
    }
    if (a.n_gguf) {
        a.files =
            sim_models_load(a.gguf, a.n_gguf, (size_t)(a.page_mib * 1048576.0), err, sizeof err);
        if (!a.files) {
            fprintf(stderr, "tracesim: %s\n", err);
            rc = 1;
            goto done;
        }
    }
    if (a.self_test) {
        rc = self_test(&a);
        goto done;
    }
    rc = run_modes(&a);
done:
    free(rows);
    args_free(&a);
    return rc;
}
