"""The prefix cache on the real daemon: greedy continuations equal with the cache on and off (the
reference prompts of tests/data on the real stories260K model, a 10-turn conversation on the cpu
backend), 50 requests sharing a 1,000-token system prompt prefilled once whether sent one after
another or together (stats count 49 hits), two API keys sharing nothing unless they name the same
cache_salt, and cache_prompt: false opting out."""
import http.client
import json
import os
import random
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-prefix-")
DATA = os.environ.get("GPUSWAPD_DATA", "tests/data")
SHAPE = "--type f16 --dim 128 --layers 4 --heads 4 --kv-heads 2 --ff 256 --vocab 400 --ctx 2048"
MODEL = gsd.mkmodel(os.path.join(TMP, "m.gguf"), SHAPE + " --seed 5")
GPUSWAP = os.path.abspath(os.path.join(gsd.BUILD, "gpuswap"))


class PrefixDaemon(gsd.Daemon):
    """gsd.Daemon on a chosen backend (cpu or sim), the cache on or off for every model."""

    def __init__(self, models, backend="sim", cache=True, **kw):
        self.backend, self.cache = backend, cache
        kw.setdefault("scheduler", "")
        kw["scheduler"] = kw["scheduler"] + "\nprefix_cache: %s" % ("true" if cache else "false")
        super().__init__(models, **kw)

    def write_config(self, *a, **kw):
        super().write_config(*a, **kw)
        text = open(self.config).read().replace("  backend: sim\n", "  backend: %s\n" % self.backend, 1)
        with open(self.config, "w") as f:
            f.write(text)


def gen(c, rid, model, tokens, n, **more):
    req = {"op": "generate", "id": rid, "model": model, "tokens": tokens, "max_tokens": n,
           "temperature": 0, "stream": True}
    req.update(more)
    c.send(req)
    ids = []
    while True:
        ev = c.recv()
        assert ev.get("id") == rid, ev
        if ev["event"] == "token":
            if ev["token"] >= 0:
                ids.append(ev["token"])
        elif ev["event"] == "done":
            return ids, ev["usage"]
        else:
            raise AssertionError(ev)


def model_stats(d, name="m"):
    return d.stats()["models"][name]


def test_reference_prompts_continue_the_same_with_the_cache_on_and_off():
    model = os.path.abspath(os.path.join(DATA, "stories260K.gguf"))
    refs = sorted(f for f in os.listdir(os.path.join(DATA, "reference"))
                  if f.startswith("greedy_") and f.endswith("_kvf16.json"))
    assert refs, "no reference prompts"
    got = {}
    for cache in (True, False):
        d = PrefixDaemon([("s", model, "")], backend="cpu", cache=cache)
        try:
            c = d.client()
            for r in refs:
                ref = json.load(open(os.path.join(DATA, "reference", r)))
                ids = ref["prompt_ids"]
                first, _ = gen(c, r + "a", "s", ids, 48)
                # the next turn resends the prompt and most of the answer: a hit when on
                more = ids + first[:32]
                second, usage = gen(c, r + "b", "s", more, 16)
                assert second == first[32:32 + len(second)], (r, cache, first, second)
                if cache and len(more) > 16:
                    assert usage.get("cached_tokens", 0) >= 16, (r, usage)
                if not cache:
                    assert "cached_tokens" not in usage, usage
                got.setdefault(r, []).append((first, second))
            c.close()
        finally:
            assert d.stop() == 0
    for r, (on, off) in got.items():
        assert on == off, (r, on, off)


def conversation(d, turns=10, new=40, n=8, seed=3):
    rnd = random.Random(seed)
    c = d.client()
    hist, outs, cached = [], [], []
    try:
        for t in range(turns):
            hist += [rnd.randrange(3, 400) for _ in range(new)]
            ids, usage = gen(c, "t%d" % t, "m", hist, n)
            outs.append(ids)
            cached.append(usage.get("cached_tokens", 0))
            hist += ids
    finally:
        c.close()
    return outs, cached


def test_a_10_turn_conversation_on_the_cpu_backend_is_the_same_with_the_cache_on_and_off():
    res = {}
    for cache in (True, False):
        d = PrefixDaemon([("m", MODEL, "max_context: 2048")], backend="cpu", cache=cache)
        try:
            res[cache] = conversation(d)
            st = model_stats(d)
        finally:
            assert d.stop() == 0
        if cache:
            # every turn from the second reuses all it sent before (the last answer token was
            # never fed back: that one and the new ones are prefilled)
            assert all(x > 0 for x in res[cache][1][1:]), res[cache][1]
            assert st["total_prefix_hits"] == 9 and st["prefix_hit_rate"] > 0.5, st
        else:
            assert st["total_prefix_lookups"] == 0 and not any(res[cache][1]), st
    assert res[True][0] == res[False][0], res


SYSTEM = [random.Random(11).randrange(3, 400) for _ in range(1000)]


def suffix(i):
    return [3 + i % 50, 100 + i % 7, 200 + i % 11]


def shared_prompt_daemon():
    # about 1 KiB of F16 KV a token: 16 sequences of 1,010 tokens in flight at once fit
    return PrefixDaemon([("m", MODEL, "max_context: 2048\nmax_batch: 16")], memory="64MiB", page="64KiB")


def check_once(st, n=50):
    assert st["total_prefix_hits"] == n - 1, st
    assert st["total_prefix_hit_tokens"] >= (n - 1) * len(SYSTEM), st
    # the system prompt prefilled once; each request's own tokens after it
    assert st["total_prompt_tokens"] <= len(SYSTEM) + n * len(suffix(0)), st


def test_50_requests_sharing_a_system_prompt_one_after_another_prefill_it_once():
    d = shared_prompt_daemon()
    try:
        c = d.client()
        for i in range(50):
            _, usage = gen(c, "r%d" % i, "m", SYSTEM + suffix(i), 2)
            assert usage.get("cached_tokens", 0) == (0 if i == 0 else len(SYSTEM)), (i, usage)
        c.close()
        check_once(model_stats(d))
    finally:
        assert d.stop() == 0


def test_50_requests_sharing_a_system_prompt_sent_together_prefill_it_once():
    d = shared_prompt_daemon()
    try:
        c = d.client()
        for i in range(50):
            c.send({"op": "generate", "id": "r%d" % i, "model": "m", "tokens": SYSTEM + suffix(i),
                    "max_tokens": 2, "temperature": 0})
        done = {}
        while len(done) < 50:
            ev = c.recv()
            if ev["event"] == "done":
                done[ev["id"]] = ev["usage"]
            assert ev["event"] != "error", ev
        c.close()
        st = model_stats(d)
        print("  together: waits %d, copies %d, hits %d, prompt tokens prefilled %d" % (
            st["total_prefix_waits"], st["total_prefix_copies"], st["total_prefix_hits"],
            st["total_prompt_tokens"]))
        check_once(st)
        assert sum(1 for u in done.values() if u.get("cached_tokens")) == 49, done
    finally:
        assert d.stop() == 0


def keygen(name):
    out = subprocess.run([GPUSWAP, "keygen", name, "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def post(port, key, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=gsd.scaled(60))
    try:
        c.request("POST", "/v1/completions", body=json.dumps(body),
                  headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
        r = c.getresponse()
        ans = json.loads(r.read())
        assert r.status == 200, ans
        return ans["usage"]["prompt_tokens_details"]["cached_tokens"]
    finally:
        c.close()


def test_two_api_keys_share_no_entries_unless_they_name_the_same_cache_salt():
    keys = {n: keygen(n) for n in ("alice", "bob")}
    port = gsd.free_port()
    auth = "auth:\n  http: true\n  keys:\n" + "".join(
        "    - name: %s\n      hash: \"%s\"\n      models: [\"*\"]\n" % (n, k["hash"]) for n, k in keys.items())
    d = PrefixDaemon([("m", MODEL, "max_context: 2048")], memory="16MiB", listen="http: 127.0.0.1:%d" % port,
                     extra=auth)
    try:
        deadline = time.time() + gsd.scaled(10)
        while True:
            try:
                http.client.HTTPConnection("127.0.0.1", port, timeout=1).connect()
                break
            except OSError:
                assert time.time() < deadline, d.logtext()
                time.sleep(0.02)
        prompt = SYSTEM[:200]
        body = {"model": "m", "prompt": prompt, "max_tokens": 1, "temperature": 0}
        a, b = keys["alice"]["key"], keys["bob"]["key"]
        assert post(port, a, body) == 0
        assert post(port, b, body) == 0  # the same prompt, another key: no hit
        assert post(port, a, body) > 0   # its own key: a hit
        salted = dict(body, cache_salt="team-1", prompt=SYSTEM[200:400])
        assert post(port, a, salted) == 0
        assert post(port, b, salted) > 0  # the same salt: shared
        assert post(port, b, dict(salted, cache_salt="team-2")) == 0
        # opted out: neither reuses nor leaves anything
        assert post(port, b, dict(salted, cache_prompt=False)) == 0
    finally:
        assert d.stop() == 0


def test_a_cached_prefix_is_reclaimed_before_weights_and_counted_apart_from_live_kv():
    d = PrefixDaemon([("m", MODEL, "max_context: 2048")], memory="16MiB")
    try:
        c = d.client()
        gen(c, "a", "m", SYSTEM[:300], 4)
        c.close()
        st = model_stats(d)
        assert st["curr_kv_seqs"] == 0 and st["curr_kv_bytes"] == 0, st
        assert st["curr_kv_cached"] == 1 and st["curr_kv_cached_bytes"] > 0, st
        assert st["total_kv_allocs"] == st["total_kv_frees"], st
        pool = d.stats()["pool"]
        used = st["curr_resident_bytes"] + st["curr_kv_cached_bytes"]
        assert used == pool["curr_pool_used"] * pool["page_size"], (st, pool)
        metrics_keys = ("total_prefix_hits", "total_prefix_hit_tokens", "prefix_hit_rate")
        assert all(k in st for k in metrics_keys), st
    finally:
        assert d.stop() == 0


if __name__ == "__main__":
    r = gsd.Runner()
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            r.run(fn)
    sys.exit(r.exit_code())
