/* fleet_render: the files `gpuswap fleet render` writes from a fleet and its placement: each host's gpuswapd.yaml and systemd drop-in, haproxy.cfg, placement.txt and the Kubernetes manifests. */
#include "fleet.h"

#include "cfg_doc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"

#define FLEET_HEADER_BYTES 16384 /* bytes of request headers HAProxy's buffer leaves room for */
#define FLEET_MAXREWRITE 1024    /* HAProxy's tune.maxrewrite default, reserved in the buffer */
#define FLEET_EPP_PORT 9002      /* the endpoint picker's ext-proc gRPC port (GIE v1.0.0) */
#define FLEET_EPP_HEALTH_PORT 9003
#define FLEET_GIE_VERSION "v1.0.0" /* the Gateway API Inference Extension release we target */

/* ------------------------------------------------------------------ writing */

typedef struct wr {
    const char *dir;
    char *err;
    size_t errlen;
} wr_t;

/* mkdir -p of path's directories (path itself is a file). */
static int mkdirs_for(wr_t *w, const char *path)
{
    char buf[4096];
    if (strlen(path) >= sizeof buf) {
        snprintf(w->err, w->errlen, "%s: path too long", path);
        return FLEET_ERR_IO;
    }
    strcpy(buf, path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
            snprintf(w->err, w->errlen, "%s: cannot create: %s", buf, strerror(errno));
            return FLEET_ERR_IO;
        }
        *p = '/';
    }
    return 0;
}

/* Opens DIR/rel for writing into a temporary file that wr_close renames. */
static FILE *wr_open(wr_t *w, const char *rel, char *tmp, size_t tmplen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", w->dir, rel);
    if (mkdirs_for(w, path))
        return NULL;
    snprintf(tmp, tmplen, "%s.tmp", path);
    FILE *fp = fopen(tmp, "w");
    if (!fp)
        snprintf(w->err, w->errlen, "%s: cannot write: %s", tmp, strerror(errno));
    return fp;
}

static int wr_close(wr_t *w, FILE *fp, const char *tmp)
{
    int bad = ferror(fp);
    if (fclose(fp) != 0 || bad) {
        snprintf(w->err, w->errlen, "%s: write error", tmp);
        unlink(tmp);
        return FLEET_ERR_IO;
    }
    char path[4096];
    snprintf(path, sizeof path, "%.*s", (int)(strlen(tmp) - 4), tmp);
    if (rename(tmp, path) != 0) {
        snprintf(w->err, w->errlen, "%s: cannot rename: %s", path, strerror(errno));
        unlink(tmp);
        return FLEET_ERR_IO;
    }
    return 0;
}

/* The fleet file's base name, as rendered files cite it (wherever it was rendered from). */
static const char *src_name(const fleet_t *f)
{
    const char *b = strrchr(f->file, '/');
    return b ? b + 1 : f->file;
}

static const char *sz(uint64_t v, char *buf, size_t n)
{
    return cfg_format_size(v, buf, n);
}

/* One host's gpuswapd.yaml, written through the daemon's schema (cfg_doc): comment lines,
 * then every option in the schema's order. k8s: the pod's variant (listens on every address
 * of the pod, sockets in /run/gpuswapd). 0, or FLEET_ERR_* with the reason in why. */
static int put_host_config(FILE *fp, const fleet_t *f, const unsigned char *place, size_t h,
                           int k8s, char *why, size_t wn)
{
    const fleet_host_t *ho = &f->hosts[h];
    size_t H = f->n_hosts, n = 0;
    uint64_t bytes = 0;
    double load = 0;
    char a[32], path[4200];
    for (size_t m = 0; m < f->n_models; m++)
        if (place[m * H + h]) {
            n++;
            bytes += f->models[m].size;
            load += f->models[m].load / f->models[m].replicas;
        }
    const char *run = k8s ? "/run/gpuswapd" : ho->run_dir;
    fprintf(fp,
            "# gpuswapd on %s, rendered by `gpuswap fleet render %s`: re-render, do not edit.\n"
            "# %zu models, %s of weights, expected load %.3g (the fleet's units).\n",
            ho->name, src_name(f), n, sz(bytes, a, sizeof a), load);
    if (!k8s)
        fprintf(
            fp,
            "# API keys: add an auth: section (README \"API keys\"; http: true, keys from `gpuswap keygen`)\n"
            "# with this host's HAProxy addresses in auth.trusted_proxies, so that its back-off after\n"
            "# failed keys counts per client (X-Forwarded-For) rather than per proxy.\n");
    cfg_doc_t *d = cfg_doc_new();
    if (!d) {
        snprintf(why, wn, "out of memory");
        return FLEET_ERR_NOMEM;
    }
    /* a draining host fails /ready and keeps serving for three health checks, so the
     * proxy takes it out of rotation before it refuses anything */
    uint64_t linger = 3 * f->proxy.check_ms < 1000 ? 1000 : 3 * f->proxy.check_ms;
    char port[16];
    snprintf(port, sizeof port, "0.0.0.0:%u", f->k8s.port);
    int rc = 0;
    snprintf(path, sizeof path, "%s/gpuswapd.sock", run);
    rc = rc ? rc : cfg_doc_set(d, "listen.socket", path, why, wn);
    rc = rc ? rc : cfg_doc_set(d, "listen.http", k8s ? port : ho->http, why, wn);
    rc =
        rc ? rc : cfg_doc_set(d, "listen.max_line", sz(f->proxy.max_request, a, sizeof a), why, wn);
    rc = rc ? rc
            : cfg_doc_set(d, "listen.drain_linger", cfg_format_duration_ms(linger, a, sizeof a),
                          why, wn);
    snprintf(path, sizeof path, "%s/admin.sock", run);
    rc = rc ? rc : cfg_doc_set(d, "admin.socket", path, why, wn);
    rc = rc ? rc : cfg_doc_set(d, "device.memory", sz(ho->device_memory, a, sizeof a), why, wn);
    rc = rc ? rc : cfg_doc_set(d, "host.memory", sz(ho->host_memory, a, sizeof a), why, wn);
    for (size_t i = 0; !rc && i < f->defaults.n_options; i++)
        rc = cfg_doc_set(d, f->defaults.options[i], f->defaults.values[i], why, wn);
    for (size_t m = 0; !rc && m < f->n_models; m++) {
        if (!place[m * H + h])
            continue;
        int mi = cfg_doc_add_model(d);
        if (mi < 0) {
            snprintf(why, wn, "out of memory");
            rc = FLEET_ERR_NOMEM;
            break;
        }
        rc = cfg_doc_model_set(d, (size_t)mi, "name", f->models[m].name, why, wn);
        rc = rc ? rc : cfg_doc_model_set(d, (size_t)mi, "path", f->models[m].path, why, wn);
    }
    if (rc) { /* fleet_load checked every value: this is a bug */
        cfg_doc_free(d);
        return FLEET_ERR_INVALID;
    }
    rc = cfg_doc_write(d, fp);
    cfg_doc_free(d);
    if (rc)
        snprintf(why, wn, "cannot write host %s's config", ho->name);
    return rc ? FLEET_ERR_IO : 0;
}

static int render_hosts(wr_t *w, const fleet_t *f, const unsigned char *place)
{
    char rel[1024], tmp[4200];
    for (size_t h = 0; h < f->n_hosts; h++) {
        const fleet_host_t *ho = &f->hosts[h];
        snprintf(rel, sizeof rel, "hosts/%s/gpuswapd.yaml", ho->name);
        FILE *fp = wr_open(w, rel, tmp, sizeof tmp);
        if (!fp)
            return FLEET_ERR_IO;
        int rc = put_host_config(fp, f, place, h, 0, w->err, w->errlen);
        if (rc) {
            fclose(fp);
            unlink(tmp);
            return rc;
        }
        if (wr_close(w, fp, tmp))
            return FLEET_ERR_IO;
        snprintf(rel, sizeof rel, "hosts/%s/gpuswapd.service.d/fleet.conf", ho->name);
        if (!(fp = wr_open(w, rel, tmp, sizeof tmp)))
            return FLEET_ERR_IO;
        fprintf(fp,
                "# /etc/systemd/system/gpuswapd.service.d/fleet.conf on %s, rendered by\n"
                "# `gpuswap fleet render %s`: the unit allows only localhost; the fleet's\n"
                "# proxy connects to listen.http (%s) from these addresses.\n"
                "[Service]\nIPAddressAllow=",
                ho->name, src_name(f), ho->http);
        for (size_t i = 0; i < f->proxy.n_addresses; i++)
            fprintf(fp, "%s%s", i ? " " : "", f->proxy.addresses[i]);
        fprintf(fp, "\n");
        if (wr_close(w, fp, tmp))
            return FLEET_ERR_IO;
    }
    return 0;
}

/* tune.bufsize: the largest request body plus its headers plus the rewrite
 * reserve, rounded up to 16 bytes and never below HAProxy's default. */
static uint64_t haproxy_bufsize(const fleet_t *f)
{
    uint64_t b = f->proxy.max_request + FLEET_HEADER_BYTES + FLEET_MAXREWRITE;
    b = (b + 15) / 16 * 16;
    return b < 16384 ? 16384 : b;
}

static void put_servers(FILE *fp, const fleet_t *f, const unsigned char *place, size_t m)
{
    for (size_t h = 0; h < f->n_hosts; h++)
        if (m == (size_t)-1 || place[m * f->n_hosts + h])
            fprintf(fp, "    server %s %s\n", f->hosts[h].name, f->hosts[h].http);
}

static int render_haproxy(wr_t *w, const fleet_t *f, const unsigned char *place)
{
    char tmp[4200], a[32];
    FILE *fp = wr_open(w, "haproxy.cfg", tmp, sizeof tmp);
    if (!fp)
        return FLEET_ERR_IO;
    uint64_t bufsize = haproxy_bufsize(f);
    uint64_t maxconn = (uint64_t)(1ull << 30) / (2 * bufsize); /* two buffers a connection, 1 GiB */
    if (maxconn > 20000)
        maxconn = 20000;
    if (maxconn < 256)
        maxconn = 256;
    unsigned long long inter = (unsigned long long)f->proxy.check_ms;
    fprintf(
        fp,
        "# HAProxy (>= 2.6) in front of the gpuswapd fleet, rendered by `gpuswap fleet render %s`:\n"
        "# re-render, do not edit. Each request goes to a backend of its model's replicas,\n"
        "# the model read from the JSON body; within it consistent hashing of the model name\n"
        "# keeps it on one replica until that one has more than %u%% of the average load, so\n"
        "# a hot model spills to its other replicas. Hosts leave rotation when /ready fails\n"
        "# (draining, models not loaded), and requests are retried on another replica when\n"
        "# the connection fails or the host answers 503 before any response started.\n"
        "global\n"
        "    maxconn %llu\n"
        "    # the whole request must fit one buffer to be read as JSON and to be retried:\n"
        "    # proxy.max_request %s + %u of headers + the %u-byte rewrite reserve\n"
        "    tune.bufsize %llu\n"
        "\n"
        "defaults\n"
        "    mode http\n"
        "    option http-buffer-request\n"
        "    # a fresh connection to the host per request: a generation is never retried once\n"
        "    # sent, so never send one on a pooled connection the host may have closed\n"
        "    option http-server-close\n"
        "    timeout connect 2s\n"
        "    timeout http-request 30s\n"
        "    timeout queue 30s\n"
        "    # a generation may be silent this long between two streamed chunks (and until\n"
        "    # the answer of a request that does not stream)\n"
        "    timeout client %llus\n"
        "    timeout server %llus\n"
        "    timeout http-keep-alive 10s\n"
        "    timeout check 2s\n"
        "    retries 3\n"
        "    retry-on conn-failure 503\n"
        "    option redispatch 1\n"
        "    # the client's address for the hosts' back-off after failed API keys (they believe\n"
        "    # it from this proxy only when it is in their auth.trusted_proxies)\n"
        "    option forwardfor\n"
        "    option httpchk GET /ready\n"
        "    http-check expect status 200\n"
        "    # a refused or broken connection takes the host out at once, so the retry goes to\n"
        "    # another replica; /ready checks bring it back. HTTP answers do not: a host that\n"
        "    # refuses a request for load (503 overloaded) is retried elsewhere and stays in\n"
        "    # rotation, and a draining one fails /ready before it refuses anything\n"
        "    default-server check inter %llums fastinter %llums downinter %llums fall 1 rise 1 "
        "observe layer4 error-limit 1 on-error mark-down\n"
        "\n"
        "frontend gpuswapd\n"
        "    # TLS ends here: for clients outside a trusted network bind with a certificate\n"
        "    # (the PEM holds the chain and the key), e.g.\n"
        "    #   bind :443 ssl crt /etc/haproxy/certs/gpuswapd.pem alpn h2,http/1.1\n"
        "    # API keys (auth: in each host's gpuswapd.yaml, http: true) pass through untouched in\n"
        "    # the Authorization header: never expose a keyed port without TLS\n"
        "    bind %s\n"
        "    http-request set-var(txn.model) req.body,json_query('$.model') if { method POST }\n",
        src_name(f), f->proxy.balance_factor, (unsigned long long)maxconn,
        sz(f->proxy.max_request, a, sizeof a), FLEET_HEADER_BYTES, FLEET_MAXREWRITE,
        (unsigned long long)bufsize, (unsigned long long)(f->proxy.stream_timeout_ms / 1000),
        (unsigned long long)(f->proxy.stream_timeout_ms / 1000), inter, inter, inter,
        f->proxy.listen);
    for (size_t m = 0; m < f->n_models; m++)
        fprintf(fp, "    use_backend model_%s if { var(txn.model) -m str %s }\n", f->models[m].name,
                f->models[m].name);
    fprintf(fp, "    # /v1/models, /health, /metrics and unknown models: any host that is ready\n"
                "    default_backend any\n");
    for (size_t m = 0; m < f->n_models; m++) {
        fprintf(fp,
                "\nbackend model_%s\n"
                "    balance hash var(txn.model)\n"
                "    hash-type consistent\n"
                "    hash-balance-factor %u\n",
                f->models[m].name, f->proxy.balance_factor);
        put_servers(fp, f, place, m);
    }
    fprintf(fp, "\nbackend any\n    balance roundrobin\n");
    put_servers(fp, f, place, (size_t)-1);
    return wr_close(w, fp, tmp);
}

static int render_placement(wr_t *w, const fleet_t *f, const unsigned char *place)
{
    char tmp[4200], a[32];
    FILE *fp = wr_open(w, "placement.txt", tmp, sizeof tmp);
    if (!fp)
        return FLEET_ERR_IO;
    size_t H = f->n_hosts;
    fprintf(fp, "# placement rendered from %s: model -> hosts, then host -> bytes, load, models\n",
            src_name(f));
    for (size_t m = 0; m < f->n_models; m++) {
        fprintf(fp, "%s:", f->models[m].name);
        for (size_t h = 0; h < H; h++)
            if (place[m * H + h])
                fprintf(fp, " %s", f->hosts[h].name);
        fprintf(fp, "\n");
    }
    for (size_t h = 0; h < H; h++) {
        uint64_t bytes = 0;
        double load = 0;
        size_t n = 0;
        for (size_t m = 0; m < f->n_models; m++)
            if (place[m * H + h]) {
                bytes += f->models[m].size;
                load += f->models[m].load / f->models[m].replicas;
                n++;
            }
        fprintf(fp, "host %s: %zu models, %s, load %.4g\n", f->hosts[h].name, n,
                sz(bytes, a, sizeof a), load);
    }
    return wr_close(w, fp, tmp);
}

/* ------------------------------------------------------------------ Kubernetes */

static void put_labels(FILE *fp, int indent, const char *pool)
{
    fprintf(fp, "%*sapp.kubernetes.io/name: gpuswapd\n", indent, "");
    if (pool)
        fprintf(fp, "%*sgpuswapd/pool: %s\n", indent, "", pool);
}

static int render_k8s_pool(wr_t *w, const fleet_t *f, const unsigned char *place, const char *pool,
                           unsigned port)
{
    char rel[1024], tmp[4200];
    snprintf(rel, sizeof rel, "k8s/pool-%s.yaml", pool);
    FILE *fp = wr_open(w, rel, tmp, sizeof tmp);
    if (!fp)
        return FLEET_ERR_IO;
    const char *ns = f->k8s.namespace_;
    size_t n = 0;
    fprintf(fp,
            "# Node pool '%s': its hosts' configs (ConfigMap, one key per pod ordinal) and the\n"
            "# StatefulSet running them; rendered by `gpuswap fleet render %s`.\n"
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gpuswapd-%s-config\n"
            "  namespace: %s\n  labels:\n",
            pool, src_name(f), pool, ns);
    put_labels(fp, 4, pool);
    fprintf(fp, "data:\n");
    for (size_t h = 0; h < f->n_hosts; h++) {
        if (strcmp(f->hosts[h].pool, pool))
            continue;
        fprintf(fp, "  # pod gpuswapd-%s-%zu is host '%s'\n  \"%zu.yaml\": |\n", pool, n,
                f->hosts[h].name, n);
        char *text = NULL;
        size_t len = 0;
        FILE *mf = open_memstream(&text, &len);
        if (!mf) {
            fclose(fp);
            unlink(tmp);
            snprintf(w->err, w->errlen, "out of memory");
            return FLEET_ERR_NOMEM;
        }
        int rc = put_host_config(mf, f, place, h, 1, w->err, w->errlen);
        fclose(mf);
        if (rc) {
            free(text);
            fclose(fp);
            unlink(tmp);
            return rc;
        }
        for (char *line = text, *nl; line && *line; line = nl ? nl + 1 : NULL) {
            nl = strchr(line, '\n');
            fprintf(fp, "    %.*s\n", nl ? (int)(nl - line) : (int)strlen(line), line);
        }
        free(text);
        n++;
    }
    uint64_t grace = f->defaults.drain_timeout_ms / 1000 + 15;
    fprintf(
        fp,
        "---\n"
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: gpuswapd-%s\n  namespace: %s\n"
        "  labels:\n",
        pool, ns);
    put_labels(fp, 4, pool);
    fprintf(fp,
            "spec:\n"
            "  serviceName: gpuswapd\n"
            "  replicas: %zu\n"
            "  podManagementPolicy: Parallel\n"
            "  selector:\n    matchLabels:\n",
            n);
    put_labels(fp, 6, pool);
    fprintf(fp, "  template:\n    metadata:\n      labels:\n");
    put_labels(fp, 8, pool);
    fprintf(
        fp,
        "      annotations:\n"
        "        prometheus.io/scrape: \"true\"\n"
        "        prometheus.io/port: \"%u\"\n"
        "        prometheus.io/path: /metrics\n"
        "    spec:\n"
        "      # SIGTERM drains: /ready fails at once, running requests finish\n"
        "      terminationGracePeriodSeconds: %llu\n"
        "      nodeSelector:\n"
        "        gpuswapd/pool: %s\n"
        "      containers:\n"
        "        - name: gpuswapd\n"
        "          image: %s\n"
        "          # the pod's ordinal picks its host's config\n"
        "          command: [\"/bin/sh\", \"-c\", \"exec gpuswapd --config /etc/gpuswapd/${HOSTNAME##*-}.yaml\"]\n"
        "          ports:\n"
        "            - name: http\n"
        "              containerPort: %u\n"
        "          readinessProbe:\n"
        "            httpGet:\n              path: /ready\n              port: http\n"
        "            periodSeconds: 2\n"
        "            failureThreshold: 1\n"
        "          livenessProbe:\n"
        "            httpGet:\n              path: /health\n              port: http\n"
        "            periodSeconds: 10\n"
        "            failureThreshold: 3\n"
        "          startupProbe:\n"
        "            httpGet:\n              path: /health\n              port: http\n"
        "            periodSeconds: 5\n"
        "            failureThreshold: 120\n"
        "          resources:\n"
        "            limits:\n"
        "              nvidia.com/gpu: 1\n"
        "          volumeMounts:\n"
        "            - name: config\n              mountPath: /etc/gpuswapd\n              readOnly: true\n"
        "            - name: models\n              mountPath: %s\n              readOnly: true\n"
        "            - name: run\n              mountPath: /run/gpuswapd\n"
        "      volumes:\n"
        "        - name: config\n          configMap:\n            name: gpuswapd-%s-config\n"
        "        - name: models\n          hostPath:\n            path: %s\n            type: Directory\n"
        "        - name: run\n          emptyDir: {}\n",
        port, (unsigned long long)grace, pool, f->k8s.image, port, f->k8s.models_dir, pool,
        f->k8s.models_dir);
    return wr_close(w, fp, tmp);
}

/* k8s/inferencepool.yaml: the Gateway API Inference Extension's InferencePool over every pod, its
 * endpoint picker (Service, ConfigMap, Deployment) and the picker's RBAC. */
static int render_k8s_gateway(wr_t *w, const fleet_t *f, unsigned port0)
{
    char tmp[4200];
    const char *ns = f->k8s.namespace_;
    FILE *fp = wr_open(w, "k8s/inferencepool.yaml", tmp, sizeof tmp);
    if (!fp)
        return FLEET_ERR_IO;
    fprintf(fp,
            "# The Gateway API Inference Extension (" FLEET_GIE_VERSION
            ") over the fleet, rendered by\n"
            "# `gpuswap fleet render %s`: an InferencePool of every gpuswapd pod and its\n"
            "# endpoint picker, which scrapes each pod's /metrics (metrics.vllm_compat names) and\n"
            "# prefers pods where the request's model is resident (lora-affinity-scorer), then\n"
            "# short queues and free KV cache. An HTTPRoute of your Gateway points at the pool.\n"
            "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\n"
            "metadata:\n  name: gpuswapd\n  namespace: %s\n"
            "spec:\n  targetPorts:\n    - number: %u\n  selector:\n    matchLabels:\n",
            src_name(f), ns, port0);
    put_labels(fp, 6, NULL);
    fprintf(
        fp,
        "  endpointPickerRef:\n    name: gpuswapd-epp\n    kind: Service\n    port:\n"
        "      number: %u\n"
        "---\n"
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: gpuswapd-epp\n  namespace: %s\n"
        "spec:\n  selector:\n    app.kubernetes.io/name: gpuswapd-epp\n  ports:\n"
        "    - name: grpc\n      protocol: TCP\n      port: %u\n      targetPort: %u\n"
        "      appProtocol: http2\n  type: ClusterIP\n"
        "---\n"
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gpuswapd-epp-config\n  namespace: %s\n"
        "data:\n  plugins.yaml: |\n"
        "    apiVersion: inference.networking.x-k8s.io/v1alpha1\n"
        "    kind: EndpointPickerConfig\n"
        "    plugins:\n"
        "      - type: lora-affinity-scorer\n"
        "      - type: queue-scorer\n"
        "      - type: kv-cache-utilization-scorer\n"
        "      - type: max-score-picker\n"
        "    schedulingProfiles:\n"
        "      - name: default\n"
        "        plugins:\n"
        "          - pluginRef: lora-affinity-scorer\n"
        "            weight: 4\n"
        "          - pluginRef: queue-scorer\n"
        "            weight: 1\n"
        "          - pluginRef: kv-cache-utilization-scorer\n"
        "            weight: 1\n"
        "          - pluginRef: max-score-picker\n"
        "---\n"
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: gpuswapd-epp\n  namespace: %s\n"
        "spec:\n  replicas: 1\n  selector:\n    matchLabels:\n"
        "      app.kubernetes.io/name: gpuswapd-epp\n"
        "  template:\n    metadata:\n      labels:\n        app.kubernetes.io/name: gpuswapd-epp\n"
        "    spec:\n      serviceAccountName: gpuswapd-epp\n"
        "      terminationGracePeriodSeconds: 130\n"
        "      containers:\n"
        "        - name: epp\n"
        "          image: registry.k8s.io/gateway-api-inference-extension/epp:" FLEET_GIE_VERSION
        "\n"
        "          args:\n"
        "            - --pool-name=gpuswapd\n"
        "            - --pool-namespace=%s\n"
        "            - --grpc-port=%u\n"
        "            - --grpc-health-port=%u\n"
        "            - --config-file=/config/plugins.yaml\n"
        "            # gpuswapd's metrics.vllm_compat names (these are also the defaults)\n"
        "            - --total-queued-requests-metric=vllm:num_requests_waiting\n"
        "            - --kv-cache-usage-percentage-metric=vllm:gpu_cache_usage_perc\n"
        "            - --lora-info-metric=vllm:lora_requests_info\n"
        "          ports:\n"
        "            - containerPort: %u\n"
        "            - containerPort: %u\n"
        "            - name: metrics\n              containerPort: 9090\n"
        "          livenessProbe:\n"
        "            grpc:\n              port: %u\n              service: inference-extension\n"
        "            periodSeconds: 10\n"
        "          readinessProbe:\n"
        "            grpc:\n              port: %u\n              service: inference-extension\n"
        "            periodSeconds: 10\n"
        "          volumeMounts:\n"
        "            - name: config\n              mountPath: /config\n"
        "      volumes:\n"
        "        - name: config\n          configMap:\n            name: gpuswapd-epp-config\n"
        "---\n"
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: gpuswapd-epp\n  namespace: %s\n"
        "---\n"
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: gpuswapd-epp\n"
        "  namespace: %s\n"
        "rules:\n"
        "  - apiGroups: [\"inference.networking.k8s.io\"]\n"
        "    resources: [\"inferencepools\"]\n    verbs: [\"get\", \"watch\", \"list\"]\n"
        "  - apiGroups: [\"inference.networking.x-k8s.io\"]\n"
        "    resources: [\"inferenceobjectives\", \"inferencepools\"]\n"
        "    verbs: [\"get\", \"watch\", \"list\"]\n"
        "  - apiGroups: [\"\"]\n    resources: [\"pods\"]\n    verbs: [\"get\", \"watch\", \"list\"]\n"
        "---\n"
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n"
        "  name: gpuswapd-epp\n  namespace: %s\n"
        "subjects:\n  - kind: ServiceAccount\n    name: gpuswapd-epp\n    namespace: %s\n"
        "roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: Role\n  name: gpuswapd-epp\n",
        FLEET_EPP_PORT, ns, FLEET_EPP_PORT, FLEET_EPP_PORT, ns, ns, ns, FLEET_EPP_PORT,
        FLEET_EPP_HEALTH_PORT, FLEET_EPP_PORT, FLEET_EPP_HEALTH_PORT, FLEET_EPP_HEALTH_PORT,
        FLEET_EPP_HEALTH_PORT, ns, ns, ns, ns);
    return wr_close(w, fp, tmp);
}

static int render_k8s(wr_t *w, const fleet_t *f, const unsigned char *place)
{
    char tmp[4200];
    unsigned port0 = f->k8s.port;
    /* pools in order of first appearance */
    for (size_t h = 0; h < f->n_hosts; h++) {
        size_t j = 0;
        while (j < h && strcmp(f->hosts[j].pool, f->hosts[h].pool))
            j++;
        if (j < h)
            continue;
        int rc = render_k8s_pool(w, f, place, f->hosts[h].pool, port0);
        if (rc)
            return rc;
    }
    const char *ns = f->k8s.namespace_;
    FILE *fp = wr_open(w, "k8s/service.yaml", tmp, sizeof tmp);
    if (!fp)
        return FLEET_ERR_IO;
    fprintf(fp,
            "# The pods' stable DNS names (gpuswapd-<pool>-<n>.gpuswapd.%s.svc), rendered by\n"
            "# `gpuswap fleet render %s`.\n"
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: gpuswapd\n  namespace: %s\n"
            "  labels:\n",
            ns, src_name(f), ns);
    put_labels(fp, 4, NULL);
    fprintf(fp, "spec:\n  clusterIP: None\n  publishNotReadyAddresses: false\n  selector:\n");
    put_labels(fp, 4, NULL);
    fprintf(fp, "  ports:\n    - name: http\n      port: %u\n      targetPort: http\n", port0);
    int rc = wr_close(w, fp, tmp);
    if (rc)
        return rc;
    return render_k8s_gateway(w, f, port0);
}

int fleet_render(const fleet_t *f, const char *dir, char *err, size_t errlen)
{
    unsigned char *place = calloc(f->n_models * f->n_hosts, 1);
    if (!place) {
        snprintf(err, errlen, "out of memory");
        return FLEET_ERR_NOMEM;
    }
    int rc = fleet_place(f, place, err, errlen);
    wr_t w = {.dir = dir, .err = err, .errlen = errlen};
    if (!rc && mkdir(dir, 0755) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "%s: cannot create: %s", dir, strerror(errno));
        rc = FLEET_ERR_IO;
    }
    if (!rc)
        rc = render_hosts(&w, f, place);
    if (!rc)
        rc = render_haproxy(&w, f, place);
    if (!rc)
        rc = render_placement(&w, f, place);
    if (!rc)
        rc = render_k8s(&w, f, place);
    free(place);
    return rc;
}
