"""The order in which resident models step: round robin, and with 4 or more of them running
sequences (sched.h SCHED_SRPT_RUNNING), shortest remaining first (the fewest max_tokens left), read
from the daemon's own token timestamps."""
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
# the running models from which the order changes (one place: sched.h)
RUNNING = int(re.search(r"#define SCHED_SRPT_RUNNING (\d+)",
                        open(os.path.join(gsd.ROOT, "daemon", "sched.h")).read()).group(1))


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


if __name__ == "__main__":
    r = gsd.Runner()
    r.run(test_with_four_models_running_the_nearly_done_one_steps_first)
    sys.exit(r.exit_code())
