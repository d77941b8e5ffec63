"""The host-RAM tier of cached KV (issue 39) on the real daemon, sim backend with copies throttled:
a conversation's model paged out (admin evict) between turns 5 and 6 takes its cached KV to host
RAM, and turn 6 copies it back instead of prefilling the history: its time to first token less
the weights' page-in is at most half the history's prefill; the continuation is the same as
without the swap (greedy); a restore whose copy fails falls back to prefilling and the request
succeeds; the tier keeps within host.memory."""
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-kvhost-")
# prefill is compute-heavy against its KV: 4 layers of dim 256 (F32), one KV head of 32
SHAPE = "--type f32 --dim 256 --layers 4 --heads 8 --kv-heads 1 --ff 1024 --vocab 400 --ctx 2048"
MODEL = gsd.mkmodel(os.path.join(TMP, "m.gguf"), SHAPE + " --seed 3")
BANDWIDTH = 96 * 1048576  # the page-in of its 16 MB takes about 0.17 s
TURN_NEW, TURN_GEN = 110, 12


class HostTierDaemon(gsd.Daemon):
    """gsd.Daemon with copies throttled to BANDWIDTH, fault injection on and host lines added."""

    def __init__(self, host="", **kw):
        self.host = host
        super().__init__([("m", MODEL, "")], memory="48MiB", **kw)

    def write_config(self, *a, **kw):
        super().write_config(*a, **kw)
        text = open(self.config).read()
        more = "  fault_injection: true\n  sim_bandwidth: %dB/s\n" % BANDWIDTH
        text = text.replace("  threads: 1\n", "  threads: 1\n" + more, 1)
        if self.host:
            text = text.replace("models:\n", "host:\n" + self.host + "models:\n", 1)
        with open(self.config, "w") as f:
            f.write(text)


def ask(c, rid, tokens, **more):
    req = {"op": "generate", "id": rid, "model": "m", "tokens": tokens, "max_tokens": TURN_GEN,
           "temperature": 0, "stream": True}
    req.update(more)
    c.send(req)
    ids = []
    while True:
        ev = c.recv()
        assert ev.get("id") == rid, ev
        if ev["event"] == "token":
            if ev["token"] >= 0:  # -1: text held back for a stop string
                ids.append(ev["token"])
        elif ev["event"] == "done":
            return ids, ev
        else:
            raise AssertionError(ev)


def converse(c, rng, turns, history=None):
    """turns turns of a conversation: each sends the whole history plus new tokens; returns it."""
    history = list(history or [])
    for t in range(turns):
        history += [rng.randrange(3, 400) for _ in range(TURN_NEW)]
        ids, _ = ask(c, "t%d" % t, history)
        history += ids
    return history


def stats(d):
    return d.stats()["models"]["m"]


def evict(d):
    ans = d.admin_call({"op": "evict", "id": "e", "model": "m"})
    assert ans.get("ok") or ans.get("event") == "done" or "error" not in ans, ans


def test_a_swap_between_turns_restores_the_history_instead_of_prefilling_it():
    d = HostTierDaemon()
    try:
        c = d.client(timeout=gsd.scaled(120))
        rng = random.Random(7)
        history = converse(c, rng, 5)
        turn6 = history + [rng.randrange(3, 400) for _ in range(TURN_NEW)]
        before = stats(d)
        evict(d)
        mid = stats(d)
        assert mid["curr_kv_host_bytes"] > 0 and mid["total_kv_demotions"] > before["total_kv_demotions"], mid
        assert mid["curr_resident_bytes"] == 0 and mid["curr_kv_cached_bytes"] == 0, mid
        ids, done = ask(c, "t6", turn6)
        after = stats(d)
        tm = done["timing"]
        assert tm["swapped"] and after["total_kv_restores"] == mid["total_kv_restores"] + 1, (tm, after)
        assert done["usage"].get("cached_tokens", 0) >= len(history) - 16, done["usage"]
        # the history prefilled, on the resident model: the cost the restore saves
        prefill = []
        for k in range(2):
            ids_full, full = ask(c, "full%d" % k, turn6, cache_prompt=False)
            prefill.append(full["timing"]["ttft_ms"])
            assert ids_full == ids, ("greedy continuations differ with and without the swap",
                                     ids_full, ids)
        re_prefill = min(prefill)
        after_swap = tm["ttft_ms"] - tm["swap_ms"]
        print("  turn 6 (%d history tokens, %d new): ttft %.1f ms, of which page-in %.1f ms; "
              "%.1f ms after it, against %.1f ms to prefill the history (%.2fx); restored %d bytes"
              % (len(history), TURN_NEW, tm["ttft_ms"], tm["swap_ms"], after_swap, re_prefill,
                 after_swap / re_prefill, after["total_kv_restore_bytes"] - mid["total_kv_restore_bytes"]))
        assert after_swap <= 0.5 * re_prefill, (after_swap, re_prefill)
        c.close()
    finally:
        assert d.stop() == 0


def test_a_restore_whose_copy_fails_is_recomputed_and_the_request_succeeds():
    d = HostTierDaemon()
    try:
        c = d.client(timeout=gsd.scaled(120))
        rng = random.Random(11)
        history = converse(c, rng, 2)
        turn = history + [rng.randrange(3, 400) for _ in range(TURN_NEW)]
        want, _ = ask(c, "want", turn, cache_prompt=False)
        evict(d)
        ask(c, "warm", [5, 6, 7, 8])  # the weights back: the next copy is the restore's
        before = stats(d)
        ans = d.admin_call({"op": "fault", "id": "f", "fault": "copy_fail", "count": 2})
        assert ans.get("ok"), ans
        ids, done = ask(c, "turn", turn)
        after = stats(d)
        assert ids == want, (ids, want)
        assert after["total_kv_restore_failures"] > before["total_kv_restore_failures"], after
        assert after["total_prefix_host_recomputes"] > before["total_prefix_host_recomputes"], after
        assert done["usage"].get("cached_tokens", 0) == 0, done["usage"]
        c.close()
    finally:
        assert d.stop() == 0


def test_the_tier_keeps_within_host_memory():
    """host.memory a little over the model's host bytes: the tier may hold only what is left, so
    with 32 KiB left the conversation's KV is dropped (and the next turn prefills and succeeds);
    with 4 MiB left it is kept."""
    probe = HostTierDaemon()
    try:
        host_bytes = stats(probe)["host_bytes"]
    finally:
        assert probe.stop() == 0
    for left, kept in ((32 * 1024, False), (4 * 1048576, True)):
        d = HostTierDaemon(host="  memory: %dB\n" % (host_bytes + left))
        try:
            c = d.client(timeout=gsd.scaled(120))
            rng = random.Random(3)
            history = converse(c, rng, 2)
            before = stats(d)
            evict(d)
            st = stats(d)
            print("  host.memory = the model's %d B + %d B: host tier %d B after the evict"
                  % (host_bytes, left, st["curr_kv_host_bytes"]))
            assert st["curr_kv_host_bytes"] <= left, st
            if kept:
                assert st["curr_kv_host_bytes"] > 0 and st["total_kv_demotions"] > 0, st
            else:
                assert st["curr_kv_host_bytes"] == 0, st
                assert st["total_prefix_evictions"] > before["total_prefix_evictions"], st
            ids, done = ask(c, "next", history + [9, 10, 11])
            assert done["finish_reason"] in ("length", "eos") and len(ids) > 0, done
            c.close()
        finally:
            assert d.stop() == 0


def main():
    r = gsd.Runner()
    for fn in (test_a_swap_between_turns_restores_the_history_instead_of_prefilling_it,
               test_a_restore_whose_copy_fails_is_recomputed_and_the_request_succeeds,
               test_the_tier_keeps_within_host_memory):
        r.run(fn)
    return r.exit_code()


if __name__ == "__main__":
    sys.exit(main())
