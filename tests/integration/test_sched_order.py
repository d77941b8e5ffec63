"""The order in which resident models step: round robin, and with 4 or more of them running
sequences (scheduler.h SCHED_SRPT_RUNNING), shortest remaining first (the fewest max_tokens left, or
where sequences have mostly stopped before their max_tokens, what their lengths so far say:
sched_passes_left), read from the daemon's own token timestamps."""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-order-")  # removed at exit
# small f16 models whose greedy output from the prompt (5, 6, 7, 8) runs 600 tokens without eos
SHAPE = "--type f16 --dim 256 --layers 8 --heads 4 --kv-heads 1 --ff 768 --vocab 512 --seed %d"
SEEDS = {"l1": 10, "l2": 12, "l3": 16, "s": 19}
MODELS = [(n, gsd.mkmodel(os.path.join(TMP, n + ".gguf"), SHAPE % k), "") for n, k in SEEDS.items()]
LONG, SHORT = 600, 40  # max_tokens of the long streams and of the short one
EOS_PROMPT = (9, 10)  # s's greedy output from it ends with eos after 36 tokens (asserted below)
# the running models from which the order changes (one place: scheduler.h)
RUNNING = int(re.search(r"#define SCHED_SRPT_RUNNING (\d+)",
                        open(os.path.join(gsd.ROOT, "daemon", "worker", "scheduler.h")).read()).group(1))


def beside(d, longs, tag):
    """Streams on the models longs (LONG tokens each), then one on s (SHORT tokens) once each long
    one has a few: returns the tokens each long stream got while s ran (first to last token of s)
    and s's tokens less one (its steps after the first)."""
    ls = [gsd.Stream(d, m, LONG, "%s-%s" % (m, tag)) for m in longs]
    gsd.until(lambda: all(len(x.ts) >= 5 for x in ls), 30)
    s = gsd.Stream(d, "s", SHORT, "s-" + tag)
    done = s.wait()
    for x in ls:
        x.cancel()
    for x in ls:
        x.wait()
    assert done["finish_reason"] == "length" and len(s.ts) == SHORT, (done, len(s.ts))
    t0, t1 = s.ts[0], s.ts[-1]
    got = [sum(1 for t in x.ts if t0 < t < t1) for x in ls]
    assert all(len(x.ts) < LONG for x in ls), "a long stream ended before s did: the window is not covered"
    return got, len(s.ts) - 1


def test_with_four_models_running_the_nearly_done_one_steps_first():
    """l1, l2 and l3 stream 600 tokens each; s's request for 40 comes: with 4 models running, s has
    the fewest max_tokens left, so it steps on every round until it is done (max_stall, 10 s here,
    is far away) and the long streams wait; with 3 models running (l1, l2 and s) they take turns."""
    assert len(SEEDS) == RUNNING, "the test runs SCHED_SRPT_RUNNING (%d) models, then one fewer" % RUNNING
    d = gsd.Daemon(MODELS, memory="256MiB", scheduler="max_stall: 10s\n")
    try:
        got, steps = beside(d, ["l1", "l2", "l3"], "four")
        print("   4 running: while s stepped %d times, the long streams got %s tokens" % (steps, got), flush=True)
        assert max(got) <= 2, (got, steps)  # at most the passes under way when s came and as it left
        got, steps = beside(d, ["l1", "l2"], "three")
        print("   3 running: while s stepped %d times, the long streams got %s tokens" % (steps, got), flush=True)
        assert min(got) >= steps // 2, (got, steps)  # round robin: about one each per s's step
    finally:
        assert d.stop() == 0


def test_where_clients_ask_for_more_than_they_use_the_lengths_seen_rank_the_streams():
    """40 requests on s that ask for 600 tokens and stop at eos after 36 teach the daemon that
    sequences stop well before their max_tokens. Then l1, l2 and l3 stream 600 tokens each, past
    60, and s's stream of 600 (a prompt without eos) comes: by max_tokens left it would rank last
    (600 against about 540) and step once per max_stall (10 s here); by the lengths seen its first
    ~30 tokens look nearly done, so it steps on every round while the long streams wait."""
    d = gsd.Daemon(MODELS, memory="256MiB", scheduler="max_stall: 10s\n")
    try:
        for k in range(5):  # 8 at a time
            teach = [gsd.Stream(d, "s", LONG, "teach-%d-%d" % (k, j), tokens=EOS_PROMPT) for j in range(8)]
            for t in teach:
                done = t.wait()
                assert done["finish_reason"] == "eos" and len(t.ts) < 40, (done, len(t.ts))
        m = d.stats()["models"]["s"]
        assert m["total_stopped_early"] == 40 and m["total_completed"] == 40, m
        ls = [gsd.Stream(d, m, LONG, m + "-asks") for m in ("l1", "l2", "l3")]
        gsd.until(lambda: all(len(x.ts) >= 60 for x in ls), 60)
        s = gsd.Stream(d, "s", LONG, "s-asks")
        gsd.until(lambda: len(s.ts) >= 26, 30)
        for x in ls + [s]:
            x.cancel()
        for x in ls + [s]:
            x.wait()
        assert all(len(x.ts) < LONG for x in ls), "a long stream ran to its end before s had 26 tokens: s was held back"
        t0, t1 = s.ts[1], s.ts[25]
        got = [sum(1 for t in x.ts if t0 < t < t1) for x in ls]
        print("   while s stepped 24 times, the long streams got %s tokens" % got, flush=True)
        assert max(got) <= 2, got
    finally:
        assert d.stop() == 0


if __name__ == "__main__":
    r = gsd.Runner()
    r.run(test_with_four_models_running_the_nearly_done_one_steps_first)
    r.run(test_where_clients_ask_for_more_than_they_use_the_lengths_seen_rank_the_streams)
    sys.exit(r.exit_code())
