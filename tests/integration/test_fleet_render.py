"""`gpuswap fleet render`: deterministic output equal to config/fleet/example, HAProxy accepts every rendered haproxy.cfg, the Kubernetes manifests parse and agree on ports, labels and probe paths, each host's gpuswapd.yaml loads in gpuswapd (hosts named by IPv4, DNS name or IPv6 too, and fleet and --check-config agree on every address), placement balance and movement when a host is added, and fleet-file errors with file:line:col."""
import filecmp
import json
import os
import random
import subprocess
import sys

import yaml

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

GPUSWAP = os.path.abspath(os.path.join(gsd.BUILD, "gpuswap"))
EXAMPLE_FLEET = os.path.join(gsd.ROOT, "config", "fleet", "fleet.yaml")
EXAMPLE_OUT = os.path.join(gsd.ROOT, "config", "fleet", "example")
TMP = gsd.tmpdir(prefix="gsd-fleet-render-")


def fleet(*args, check=True):
    p = subprocess.run([GPUSWAP, "fleet"] + list(args), capture_output=True, text=True, timeout=60)
    if check and p.returncode != 0:
        raise AssertionError("gpuswap fleet %s: %d\n%s%s" % (" ".join(args), p.returncode, p.stdout, p.stderr))
    return p


def render(fleet_path, out):
    fleet("render", fleet_path, "--out", out)
    return out


def files_under(d):
    return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs)


def haproxy_check(cfg):
    if not gsd.haproxy_path():
        raise AssertionError("haproxy is missing: apt-get install haproxy (make deps)")
    p = subprocess.run([gsd.haproxy_path(), "-c", "-f", cfg], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, (cfg, p.stdout, p.stderr)


def synthetic(H, M, seed=1, replicas=2, port0=20000):
    r = random.Random(seed)
    lines = ["proxy:", "  listen: 127.0.0.1:1", "  addresses: [127.0.0.1]", "hosts:"]
    for h in range(H):
        lines += ["  - name: h%d" % h, "    http: 127.0.0.1:%d" % (port0 + h),
                  "    device_memory: 80GiB", "    host_memory: 0"]
    lines += ["models:"]
    for m in range(M):
        lines += ["  - name: m%d" % m, "    path: /models/m%d.gguf" % m,
                  "    size: %dMiB" % r.randint(1000, 16000), "    load: %g" % (10.0 / (m + 1)),
                  "    replicas: %d" % replicas]
    path = os.path.join(TMP, "synthetic-%d-%d-%d.yaml" % (H, M, seed))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def placement(path):
    out = fleet("place", path).stdout
    return {(l.split(":")[0], h) for l in out.splitlines() for h in l.split(":", 1)[1].split()}


def test_rendering_is_deterministic_and_matches_the_committed_example():
    a = render(EXAMPLE_FLEET, os.path.join(TMP, "a"))
    b = render(EXAMPLE_FLEET, os.path.join(TMP, "b"))
    assert files_under(a) == files_under(b) == files_under(EXAMPLE_OUT), \
        (files_under(a), files_under(EXAMPLE_OUT))
    for rel in files_under(a):
        assert filecmp.cmp(os.path.join(a, rel), os.path.join(b, rel), shallow=False), rel
        assert filecmp.cmp(os.path.join(a, rel), os.path.join(EXAMPLE_OUT, rel), shallow=False), \
            "config/fleet/example/%s is stale: re-render it" % rel
    # the hosts' order in the file does not change the placement
    text = open(EXAMPLE_FLEET).read()
    head, hosts_models = text.split("\nhosts:", 1)
    hosts, models = hosts_models.split("\nmodels:", 1)
    entries = ["  - name:" + e for e in hosts.split("  - name:")[1:]]
    swapped = head + "\nhosts:" + hosts.split("  - name:")[0] + "".join(reversed(entries)) + "\nmodels:" + models
    p = os.path.join(TMP, "reversed.yaml")
    with open(p, "w") as f:
        f.write(swapped)
    assert placement(p) == placement(EXAMPLE_FLEET)


def test_haproxy_accepts_every_rendered_config():
    haproxy_check(os.path.join(EXAMPLE_OUT, "haproxy.cfg"))
    for H, M in ((1, 1), (3, 12), (8, 40)):
        out = render(synthetic(H, M, replicas=min(2, H)), os.path.join(TMP, "ha-%d-%d" % (H, M)))
        haproxy_check(os.path.join(out, "haproxy.cfg"))
        text = open(os.path.join(out, "haproxy.cfg")).read()
        for needle in ("json_query('$.model')", "hash-type consistent", "hash-balance-factor 150",
                       "option httpchk GET /ready", "retry-on conn-failure 503", "tune.bufsize 1065984"):
            assert needle in text, needle
        # one backend per model listing exactly its replicas
        for model, host in placement(synthetic(H, M, replicas=min(2, H))):
            sect = text.split("\nbackend model_%s\n" % model, 1)[1].split("\nbackend ", 1)[0]
            assert "    server %s " % host in sect, (model, host)
            assert sect.count("    server ") == min(2, H), sect


def test_kubernetes_manifests_parse_and_agree_on_ports_labels_and_probes():
    k8s = os.path.join(EXAMPLE_OUT, "k8s")
    objs = []
    for name in sorted(os.listdir(k8s)):
        with open(os.path.join(k8s, name)) as f:
            for doc in yaml.safe_load_all(f):
                assert doc and doc.get("apiVersion") and doc.get("kind") and \
                    doc.get("metadata", {}).get("name"), (name, doc)
                objs.append(doc)
    kinds = {}
    for o in objs:
        kinds.setdefault(o["kind"], []).append(o)
    svc = next(o for o in kinds["Service"] if o["metadata"]["name"] == "gpuswapd")
    pool = kinds["InferencePool"][0]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    sts = kinds["StatefulSet"]
    assert len(sts) == 2, [s["metadata"]["name"] for s in sts]
    port = svc["spec"]["ports"][0]["port"]
    assert svc["spec"]["clusterIP"] == "None"
    assert pool["spec"]["targetPorts"] == [{"number": port}]
    fleet_doc = yaml.safe_load(open(EXAMPLE_FLEET))
    for s in sts:
        spec = s["spec"]
        assert spec["serviceName"] == svc["metadata"]["name"]
        labels = spec["template"]["metadata"]["labels"]
        assert spec["selector"]["matchLabels"] == labels
        for sel in (svc["spec"]["selector"], pool["spec"]["selector"]["matchLabels"]):
            assert all(labels.get(k) == v for k, v in sel.items()), (sel, labels)
        ann = spec["template"]["metadata"]["annotations"]
        c = spec["template"]["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["http"] == port and ann["prometheus.io/port"] == str(port)
        assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/path"] == "/metrics"
        assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
        assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
        # the ConfigMap has one config per pod, listening on the container port
        cm_name = next(v["configMap"]["name"] for v in spec["template"]["spec"]["volumes"]
                       if v["name"] == "config")
        cm = next(o for o in kinds["ConfigMap"] if o["metadata"]["name"] == cm_name)
        poolname = labels["gpuswapd/pool"]
        hosts = [h for h in fleet_doc["hosts"] if h.get("pool", "gpuswapd") == poolname]
        assert spec["replicas"] == len(hosts) == len(cm["data"])
        for i in range(len(hosts)):
            conf = yaml.safe_load(cm["data"]["%d.yaml" % i])
            assert conf["listen"]["http"] == "0.0.0.0:%d" % port, conf["listen"]
            assert conf["metrics"]["vllm_compat"] is True
    epp = next(o for o in kinds["Deployment"] if o["metadata"]["name"] == "gpuswapd-epp")
    args = epp["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--pool-name=%s" % pool["metadata"]["name"] in args
    assert "--lora-info-metric=vllm:lora_requests_info" in args
    epp_svc = next(o for o in kinds["Service"] if o["metadata"]["name"] == "gpuswapd-epp")
    assert pool["spec"]["endpointPickerRef"]["name"] == epp_svc["metadata"]["name"]
    assert pool["spec"]["endpointPickerRef"]["port"]["number"] == epp_svc["spec"]["ports"][0]["port"]


def test_host_configs_load_in_gpuswapd_with_their_models():
    shape = "--type f16 --dim 64 --layers 2 --heads 2 --kv-heads 1 --ff 128 --vocab 300"
    lines = ["proxy:", "  listen: 127.0.0.1:1", "  addresses: [127.0.0.1, 10.1.2.0/24]",
             "defaults:", "  backend: sim", "  page_size: 64KiB", "  run_dir: %s" % TMP, "hosts:"]
    for h in range(3):
        lines += ["  - name: h%d" % h, "    http: 127.0.0.1:%d" % (21000 + h),
                  "    device_memory: 4MiB", "    host_memory: 64MiB"]
    lines.append("models:")
    for m in range(5):
        # one file name that a plain YAML scalar could not carry: the rendering quotes paths
        fname = "m%d #1: odd.gguf" % m if m == 4 else "m%d.gguf" % m
        path = gsd.mkmodel(os.path.join(TMP, fname), shape + " --seed %d" % (m + 1))
        lines += ["  - name: m%d" % m, "    path: \"%s\"" % path, "    size: %d" % os.path.getsize(path)]
    fp = os.path.join(TMP, "small.yaml")
    with open(fp, "w") as f:
        f.write("\n".join(lines) + "\n")
    out = render(fp, os.path.join(TMP, "small"))
    served = set()
    for h in range(3):
        conf = os.path.join(out, "hosts", "h%d" % h, "gpuswapd.yaml")
        p = subprocess.run([gsd.GPUSWAPD, "--check-config", conf, "--remote"], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, (conf, p.stderr)
        served |= {(m["name"], h) for m in yaml.safe_load(p.stdout)["models"]}
        dropin = open(os.path.join(out, "hosts", "h%d" % h, "gpuswapd.service.d", "fleet.conf")).read()
        assert "[Service]\nIPAddressAllow=127.0.0.1 10.1.2.0/24\n" in dropin, dropin
    assert len(served) == 5 * 2 and {m for m, _ in served} == {"m%d" % i for i in range(5)}, served


def check_config(path):
    # --remote: these are other hosts' configs (their addresses are not this machine's)
    return subprocess.run([gsd.GPUSWAPD, "--check-config", path, "--remote"], capture_output=True, text=True,
                          timeout=60)


def test_hosts_named_by_ip_dns_name_and_ipv6_render_configs_that_pass_check_config():
    """One host:port validator (config/hostport.c): hosts named by IPv4, DNS names (gpu_a.local too:
    '_' is allowed on both sides) and bracketed IPv6 render configs that pass --check-config; and an
    address the fleet file refuses, --check-config refuses too, and the other way round."""
    model = gsd.mkmodel(os.path.join(TMP, "hp.gguf"), "--type f16 --dim 64 --layers 2 --heads 2 "
                        "--kv-heads 1 --ff 128 --vocab 300 --seed 3")
    hosts = [("h-ip", "127.0.0.1:%d"), ("h-dns", "localhost:%d"), ("h_us", "gpu_a.local:%d"),
             ("h-v6", "[::1]:%d"), ("h-v6all", "[::]:%d")]
    lines = ["proxy:", "  listen: \"[::1]:%d\"" % gsd.free_port(), "  addresses: [127.0.0.1, \"::1\"]",
             "defaults:", "  backend: sim", "  page_size: 64KiB", "  run_dir: %s" % TMP, "hosts:"]
    for name, http in hosts:
        lines += ["  - name: %s" % name, "    http: \"%s\"" % (http % gsd.free_port()),
                  "    device_memory: 4MiB", "    host_memory: 64MiB"]
    lines += ["models:", "  - name: m", "    path: \"%s\"" % model, "    size: %d" % os.path.getsize(model),
              "    replicas: %d" % len(hosts)]
    fp = os.path.join(TMP, "hostport.yaml")
    with open(fp, "w") as f:
        f.write("\n".join(lines) + "\n")
    out = render(fp, os.path.join(TMP, "hostport"))
    for name, http in hosts:
        conf = os.path.join(out, "hosts", name, "gpuswapd.yaml")
        p = check_config(conf)
        assert p.returncode == 0, (conf, open(conf).read(), p.stderr)
        got = yaml.safe_load(p.stdout)["listen"]["http"]
        assert got == yaml.safe_load(open(conf))["listen"]["http"] and got.startswith(http.split("%")[0]), got
    # both sides give the same verdict, address by address
    candidates = ["127.0.0.1:8400", "gpu_a.local:8400", "gpu-a.example.com:1", "[::1]:8400", "[fe80::1]:80",
                  "::1:8400", "[localhost]:80", "300.1.1.1:80", "1.2.3:80", "-gpu.local:80", "gpu-.local:80",
                  "a..b:80", "gpu a:80", "localhost:0", "localhost:65536", "localhost:http", ":8400",
                  "localhost", "h\u00e9.local:80", "[::1%lo]:80", "a" * 64 + ".local:80"]
    sock = os.path.join(TMP, "hp.sock")
    for i, addr in enumerate(candidates):
        ff = os.path.join(TMP, "hp-fleet-%d.yaml" % i)
        with open(ff, "w") as f:
            f.write("proxy:\n  listen: 127.0.0.1:1\n  addresses: [127.0.0.1]\nhosts:\n  - name: a\n"
                    "    http: %s\n    device_memory: 4MiB\n    host_memory: 64MiB\nmodels:\n  - name: m\n"
                    "    path: \"%s\"\n    size: 1\n    replicas: 1\n" % (json.dumps(addr), model))
        r = fleet("render", ff, "--out", os.path.join(TMP, "hp-out-%d" % i), check=False)
        cf = os.path.join(TMP, "hp-conf-%d.yaml" % i)
        with open(cf, "w") as f:
            f.write("listen:\n  socket: %s\n  http: %s\nmodels:\n  - name: m\n    path: \"%s\"\n"
                    % (json.dumps(sock), json.dumps(addr), model))
        c = check_config(cf)
        assert (r.returncode == 0) == (c.returncode == 0), (addr, r.returncode, r.stderr, c.returncode, c.stderr)
        if r.returncode:
            assert "is not host:port (" in r.stderr and "invalid address" in c.stderr, (addr, r.stderr, c.stderr)
        print("  %-24s %s on both sides" % (addr, "accepted" if r.returncode == 0 else "refused"))


def test_placement_is_balanced_and_adding_a_host_moves_about_one_in_h():
    for H, M in ((4, 40), (8, 40), (8, 200), (16, 200)):
        a = placement(synthetic(H, M))
        b = placement(synthetic(H + 1, M))
        assert len(a) == len(b) == 2 * M
        moved = len(a - b)
        # the new host's fair part is 1/(H+1) of the placements; bounded loads move a few more
        assert moved <= 2.0 * len(a) / (H + 1), (H, M, moved, len(a))
        print("  H %d -> %d, %d models x 2: %d of %d placements moved (1/H = %.0f)"
              % (H, H + 1, M, moved, len(a), len(a) / (H + 1)))
        # balance: no host holds more than 1.5x its share of bytes + load, plus one model
        per = {}
        for m, h in a:
            per.setdefault(h, 0)
            per[h] += 1
        assert max(per.values()) <= 1.5 * 2 * M / H + 3, per


def test_fleet_file_errors_name_file_line_and_column():
    cases = [
        ("proxy:\n  listen: 127.0.0.1:1\n  addresses: [127.0.0.1]\n  bogus: 1\n", ":4:3: unknown key 'bogus' in proxy"),
        ("proxy:\n  listen: 127.0.0.1:1\n  addresses: [127.0.0.1]\nhosts:\n  - name: a\n    http: x\n",
         ":6:11: hosts[0].http \"x\" is not host:port"),
        ("proxy:\n  listen: 127.0.0.1:1\n  addresses: [127.0.0.1]\nhosts:\n  - name: a\n    http: h:1\n"
         "    device_memory: 1GiB\n    host_memory: 1GiB\nmodels:\n  - name: m\n    path: /m\n    size: 1GiB\n"
         "    replicas: 2\n", "'m' wants 2 replicas, the fleet has 1 hosts"),
        ("proxy:\n  listen: 127.0.0.1:1\n  addresses: [127.0.0.1]\nhosts:\n  - name: a\n    http: h:1\n"
         "    device_memory: 1GiB\n    host_memory: 1GiB\nmodels:\n  - name: m\n    path: /m\n    size: 2GiB\n",
         "host 'a' must hold 2GiB of models, more than its host_memory 1GiB"),
        ("proxy:\n  listen: 127.0.0.1:1\n  addresses: [127.0.0.1]\n  listen: 127.0.0.1:2\n",
         ":4:3: duplicate key 'listen' in proxy"),
    ]
    for i, (text, want) in enumerate(cases):
        p = os.path.join(TMP, "bad%d.yaml" % i)
        with open(p, "w") as f:
            f.write(text)
        r = fleet("render", p, "--out", os.path.join(TMP, "bad-out"), check=False)
        assert r.returncode == 1 and want in r.stderr, (want, r.stderr)
    r = fleet("render", EXAMPLE_FLEET, check=False)
    assert r.returncode == 2 and "usage" in r.stderr, r


if __name__ == "__main__":
    r = gsd.Runner()
    for fn in [test_rendering_is_deterministic_and_matches_the_committed_example,
               test_haproxy_accepts_every_rendered_config,
               test_kubernetes_manifests_parse_and_agree_on_ports_labels_and_probes,
               test_host_configs_load_in_gpuswapd_with_their_models,
               test_hosts_named_by_ip_dns_name_and_ipv6_render_configs_that_pass_check_config,
               test_placement_is_balanced_and_adding_a_host_moves_about_one_in_h,
               test_fleet_file_errors_name_file_line_and_column]:
        r.run(fn)
    sys.exit(r.exit_code())
