/* workload: request traces for the simulator: Poisson or Gamma arrivals, Zipf model popularity, length distributions, and the Azure Functions 2019 trace format. */
#ifndef WORKLOAD_H
#define WORKLOAD_H

#include <stddef.h>
#include <stdint.h>

enum {
    WL_OK = 0,
    WL_ERR_ARG = -1,
    WL_ERR_NOMEM = -2,
    WL_ERR_IO = -3,
    WL_ERR_FORMAT = -4,
};

/* xoshiro256**, seeded through splitmix64: the same seed gives the same
 * stream on every machine. */
typedef struct wl_rng {
    uint64_t s[4];
} wl_rng_t;

void wl_rng_seed(wl_rng_t *r, uint64_t seed);
uint64_t wl_rng_u64(wl_rng_t *r);
double wl_rng_uniform(wl_rng_t *r);             /* (0, 1) */
double wl_rng_normal(wl_rng_t *r);              /* N(0, 1) */
double wl_rng_gamma(wl_rng_t *r, double shape); /* Gamma(shape, 1) */

/* One request of a trace. */
typedef struct wl_req {
    double t;         /* arrival, seconds from the trace start */
    int model;        /* 0 .. n_models-1 */
    uint32_t prompt;  /* prompt tokens */
    uint32_t output;  /* tokens to generate (max_tokens, no early stop) */
    uint32_t session; /* conversation + 1 (conv.h): the prompt starts with the session's last
                         turn (its prompt and output); 0 = none */
    uint32_t history; /* tokens of the prompt that are the session's earlier turns */
    uint32_t adapter; /* LoRA adapter + 1 of the model (sim_cfg_t.lora_n); 0 = none */
} wl_req_t;

typedef enum wl_arrival {
    WL_ARRIVAL_POISSON = 0, /* exponential inter-arrival times */
    WL_ARRIVAL_GAMMA = 1,   /* Gamma inter-arrival times with a chosen CV (> 1: bursty) */
} wl_arrival_t;

/* A length distribution: lognormal with this median and sigma (of the log),
 * clamped to [min, max]; sigma 0 = always the median. */
typedef struct wl_len {
    double median;
    double sigma;
    uint32_t min, max;
} wl_len_t;

typedef struct wl_params {
    int n_models;
    double zipf_s;     /* popularity of the model of rank i is ~ 1 / (i+1)^s */
    double rate;       /* requests/s */
    double duration_s; /* arrivals in [0, duration) */
    wl_arrival_t arrival;
    double cv; /* Gamma: coefficient of variation of inter-arrival times */
    wl_len_t prompt, output;
    uint64_t seed;
} wl_params_t;

/* Mean of a clamped lognormal length (numerically, for capacity estimates). */
double wl_len_mean(const wl_len_t *l);

/* The share of a synthetic trace's requests that go to a model (Zipf). */
double wl_popularity(const wl_params_t *p, int model);

/* Synthetic trace: *out is malloc'ed (caller frees), sorted by t. */
int wl_generate(const wl_params_t *p, wl_req_t **out, size_t *n);

/* Token counts from recorded requests: each of reqs[0..n) takes the prompt
 * and output of a seeded uniform draw from src[0..n_src) (arrivals and
 * models stay). */
void wl_tokens_draw(wl_req_t *reqs, size_t n, const wl_req_t *src, size_t n_src, uint64_t seed);

/* A recorded request list: one request a line, "arrival_s model
 * prompt_tokens output_tokens" (whitespace-separated; '#' starts a comment),
 * arrivals non-decreasing, models 0..n_models-1. *out malloc'ed (caller
 * frees); err names the file and line on failure. */
int wl_requests_read(const char *path, int n_models, wl_req_t **out, size_t *n, char *err,
                     size_t errlen);

/* A recorded LLM request trace, Azure LLM inference 2023 format: CSV with the
 * header TIMESTAMP,ContextTokens,GeneratedTokens and one request a line
 * ("2023-11-16 18:17:03.9799600,4808,10"), in time order. Arrival times are
 * kept (from the first request, divided by time_scale), token counts too
 * (at least 1 each; a prompt is cut so prompt + output fits max_ctx); each
 * request's model is a seeded Zipf(zipf_s) draw over n_models. */
typedef struct wl_llm_trace {
    int n_models;
    double zipf_s;
    double time_scale; /* > 1 compresses time */
    uint32_t max_ctx;  /* prompt + output at most (0 = no cut) */
    uint64_t seed;
} wl_llm_trace_t;

/* *out malloc'ed (caller frees), sorted by t; err names the file and line on failure. */
int wl_llm_trace_read(const char *path, const wl_llm_trace_t *a, wl_req_t **out, size_t *n,
                      char *err, size_t errlen);

/* Azure Functions 2019 invocation counts: CSV with the header
 * HashOwner,HashApp,HashFunction,Trigger,1,...,1440 and one row per
 * function with its invocations in each minute of a day. */
typedef struct wl_azure {
    int n_models;      /* the top n_models functions by volume become models 0..n-1 in
                             rank order; every other function maps to hash(HashFunction) % n */
    int start_min;     /* first minute used, 0-based */
    int n_min;         /* minutes used (0 = to the end of the day) */
    double time_scale; /* > 1 compresses time: one trace minute lasts 60 / time_scale s */
    wl_len_t prompt, output;
    uint64_t seed; /* places arrivals uniformly inside their minute, draws lengths */
} wl_azure_t;

/* Read a trace file into requests (*out malloc'ed, sorted by t); err says why on failure. */
int wl_azure_read(const char *path, const wl_azure_t *a, wl_req_t **out, size_t *n, char *err,
                  size_t errlen);
/* Write a small synthetic file in that format: n_func functions with
 * Zipf-like volumes and bursty on/off minutes, ~per_min invocations a minute
 * in all. */
int wl_azure_write_sample(const char *path, int n_func, double per_min, uint64_t seed);

#endif
