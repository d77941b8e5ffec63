"""Host RAM of small models (issue 35): with the default 2 MiB device pages a 1.2 MB model holds about its
own size in host RAM, not a page per segment (14 MiB), by the store's accounting (`models`, `stats`, the load
log line) and by the daemon's resident memory; paged onto the device from its packed host image it answers
exactly as the one-shot engine does."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

PATH = os.path.join(gsd.ROOT, "tests", "data", "stories260K.gguf")
PAGE = 2 << 20
N_SEGS = 5 + 2  # stories260K: 5 layers, the embedding and the head
COPIES = 5
PROMPTS = ["Once upon a time", "Lily went to the park"]


def rss_anon(pid):
    """The process's anonymous resident memory (heap, the host store's images), bytes."""
    for line in open("/proc/%d/status" % pid):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/%d/status" % pid)


def daemon(n, memory="64MiB"):
    return gsd.Daemon([("m%d" % i, PATH, "") for i in range(n)], memory=memory, page="2MiB")


def test_a_small_model_holds_about_its_size_in_host_ram_at_2mib_pages():
    size = os.path.getsize(PATH)
    d = daemon(COPIES, memory="%dMiB" % (COPIES * 16))
    try:
        models = {m["name"]: m for m in d.admin_call({"op": "models", "id": "m"})["models"]}
        stats = d.stats()["models"]
        for name, m in models.items():
            # the device keeps whole pages per segment (it maps and evicts them); host RAM does not
            assert m["weight_bytes"] == N_SEGS * PAGE, m
            assert m["host_bytes"] <= size + N_SEGS * 4096, (m["host_bytes"], size)
            assert stats[name]["host_bytes"] == m["host_bytes"], stats[name]
        log = d.logtext()
        assert "1.1 MiB in host RAM" in log, log
        print("   stories260K (%d bytes): host_bytes %d, weight_bytes (device) %d" % (
            size, models["m0"]["host_bytes"], models["m0"]["weight_bytes"]), flush=True)
        many = rss_anon(d.proc.pid)
    finally:
        assert d.stop() == 0
    d = daemon(1)
    try:
        one = rss_anon(d.proc.pid)
    finally:
        assert d.stop() == 0
    per_model = (many - one) / (COPIES - 1)
    print("   resident anonymous memory: %.1f MiB with 1 model, %.1f MiB with %d: %.2f MiB per model "
          "(14 MiB each when every segment took whole 2 MiB pages)" % (
              one / 2**20, many / 2**20, COPIES, per_model / 2**20), flush=True)
    assert per_model < 4 * 2**20, per_model


def test_small_models_paged_through_a_small_pool_answer_as_the_engine_does():
    """Three copies on a pool that holds two: every request pages one in over pages another model left its
    bytes in (a page-in copies the packed segment, not the whole span)."""
    want = {p: gsd.generate_cli(PATH, p, 12) for p in PROMPTS}
    d = daemon(3, memory="36MiB")
    try:
        c = d.client()
        for k in range(6):
            name, p = "m%d" % (k % 3), PROMPTS[k % 2]
            done = c.call({"op": "generate", "id": "r%d" % k, "model": name, "prompt": p, "max_tokens": 12,
                           "temperature": 0})
            assert done.get("event") == "done", done
            assert done["text"] == want[p]["text"], (name, p, done["text"], want[p]["text"])
        c.close()
        st = d.stats()["models"]
        assert sum(m["evictions_capacity"] for m in st.values()) > 0, st
    finally:
        assert d.stop() == 0


if __name__ == "__main__":
    r = gsd.Runner()
    for fn in [test_a_small_model_holds_about_its_size_in_host_ram_at_2mib_pages,
               test_small_models_paged_through_a_small_pool_answer_as_the_engine_does]:
        r.run(fn)
    sys.exit(r.exit_code())
