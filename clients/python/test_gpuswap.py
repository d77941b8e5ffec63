"""Tests of clients/python/gpuswap.py against a real gpuswapd on the sim backend (stdlib unittest).

Run from anywhere: /usr/bin/python3 clients/python/test_gpuswap.py (GPUSWAPD_BUILD names the
build directory, default build/ of the repository). Ends with "N passed, N failed"."""
import os
import sys
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
os.environ["GPUSWAPD_BUILD"] = os.path.abspath(os.environ.get("GPUSWAPD_BUILD") or os.path.join(ROOT, "build"))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import gpuswap  # noqa: E402
import gsd  # noqa: E402

SHAPE = "--type f16 --dim 128 --layers 4 --heads 4 --kv-heads 2 --ff 256 --vocab 400"
D = None
MODELS = None


def setUpModule():
    global D, MODELS
    tmp = gsd.tmpdir(prefix="gpuswap-py-")
    MODELS = [("m0", gsd.mkmodel(os.path.join(tmp, "m0.gguf"), SHAPE + " --seed 1"), ""),
              ("q0", gsd.mkmodel(os.path.join(tmp, "q0.gguf"), "--arch qwen2 " + SHAPE + " --seed 2"), ""),
              ("big", gsd.mkmodel(os.path.join(tmp, "big.gguf"),
                                  "--type f16 --dim 256 --layers 8 --heads 8 --kv-heads 4 --ff 768 "
                                  "--vocab 400 --ctx 4096 --seed 3"), "")]
    D = gsd.Daemon(MODELS, memory="32MiB", page="256KiB")


def tearDownModule():
    if D is not None:
        rc = D.stop()
        if rc != 0:
            raise AssertionError("gpuswapd exited %r:\n%s" % (rc, D.logtext()))


def client(**kw):
    return gpuswap.Client(socket_path=D.sock, admin_socket=D.admin, timeout=60, **kw)


class Inference(unittest.TestCase):
    def setUp(self):
        self.c = client()

    def tearDown(self):
        self.c.close()

    def test_generate_returns_the_done_dict_equal_to_the_one_shot_engine(self):
        want = gsd.generate_cli(MODELS[0][1], "Once upon a time", 12)
        done = self.c.generate("m0", "Once upon a time", max_tokens=12, temperature=0)
        self.assertEqual(done["event"], "done")
        self.assertEqual(done["text"], want["text"])
        self.assertEqual(done["usage"]["completion_tokens"], 12)
        self.assertEqual(done["usage"]["prompt_tokens"], len(want["prompt_ids"]))
        self.assertIn("ttft_ms", done["timing"])

    def test_generate_from_token_ids_equals_generate_from_text(self):
        ids = self.c.tokenize("m0", "Once upon a time")
        self.assertIsInstance(ids, list)
        self.assertTrue(all(isinstance(i, int) for i in ids))
        a = self.c.generate("m0", "Once upon a time", max_tokens=8, temperature=0)
        b = self.c.generate("m0", tokens=ids, max_tokens=8, temperature=0)
        self.assertEqual(a["text"], b["text"])

    def test_tokenize_without_bos_drops_one_id(self):
        with_bos = self.c.tokenize("m0", "hello world")
        without = self.c.tokenize("m0", "hello world", add_bos=False)
        self.assertEqual(with_bos[1:], without)

    def test_a_stream_yields_texts_that_concatenate_to_the_done_text(self):
        s = self.c.generate("q0", "The cat", stream=True, max_tokens=10, temperature=0)
        parts = list(s)
        self.assertTrue(parts)
        self.assertIsNotNone(s.done)
        self.assertEqual("".join(parts), s.done["text"])
        self.assertEqual(s.text, s.done["text"])
        self.assertEqual(s.finish_reason, s.done["finish_reason"])
        plain = self.c.generate("q0", "The cat", max_tokens=10, temperature=0)
        self.assertEqual(plain["text"], s.text)

    def test_sampling_with_a_seed_is_reproducible(self):
        kw = dict(max_tokens=10, temperature=0.9, top_k=20, top_p=0.9, min_p=0.01, repeat_penalty=1.1, seed=7)
        a = self.c.generate("m0", "hello", **kw)
        b = self.c.generate("m0", "hello", **kw)
        self.assertEqual(a["text"], b["text"])

    def test_a_stop_string_ends_the_text_before_it(self):
        full = self.c.generate("m0", "Once", max_tokens=20, temperature=0)["text"]
        stop = full[len(full) // 2:len(full) // 2 + 2] or full[:1]
        if not stop.strip("\x00"):
            self.skipTest("no usable stop string in %r" % full)
        done = self.c.generate("m0", "Once", max_tokens=20, temperature=0, stop=[stop])
        self.assertEqual(done["finish_reason"], "stop")
        self.assertNotIn(stop, done["text"])
        self.assertTrue(full.startswith(done["text"]))

    def test_chat_and_chat_stream_agree(self):
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
        done = self.c.chat("m0", msgs, max_tokens=8, temperature=0)
        self.assertEqual(done["event"], "done")
        s = self.c.chat("m0", msgs, stream=True, max_tokens=8, temperature=0)
        self.assertEqual("".join(s), done["text"])
        # the second reuses the first's cached prompt prefix: usage says so (cached_tokens)
        self.assertEqual(s.done["usage"]["prompt_tokens"], done["usage"]["prompt_tokens"])
        self.assertEqual(s.done["usage"]["completion_tokens"], done["usage"]["completion_tokens"])

    def test_models_lists_the_configured_models(self):
        names = [m["name"] for m in self.c.models()]
        self.assertEqual(names, ["m0", "q0", "big"])
        admin = self.c.models(admin=True)
        self.assertIn("gpu_quota", admin[0])

    def test_an_unknown_model_raises_gpuswap_error_with_the_code(self):
        with self.assertRaises(gpuswap.GpuswapError) as cm:
            self.c.generate("nope", "hi")
        self.assertEqual(cm.exception.code, "unknown_model")
        self.assertIn("m0", cm.exception.message)
        # the client goes on working
        self.assertEqual(self.c.generate("m0", "hi", max_tokens=2)["event"], "done")

    def test_a_misspelt_sampling_keyword_is_a_bad_request_naming_it(self):
        with self.assertRaises(gpuswap.GpuswapError) as cm:
            self.c.generate("m0", "hi", max_token=3)
        self.assertEqual(cm.exception.code, "bad_request")
        self.assertIn("max_token", cm.exception.message)
        with self.assertRaises(gpuswap.GpuswapError) as cm:
            self.c.generate("m0", "hi", top_p=1.5)
        self.assertEqual(cm.exception.code, "bad_request")

    def test_an_unknown_model_in_a_stream_raises_on_iteration(self):
        s = self.c.generate("nope", "hi", stream=True)
        with self.assertRaises(gpuswap.GpuswapError) as cm:
            list(s)
        self.assertEqual(cm.exception.code, "unknown_model")
        self.assertEqual(self.c.generate("m0", "hi", max_tokens=2)["event"], "done")

    def test_cancel_while_streaming_ends_with_finish_reason_cancelled(self):
        s = self.c.generate("big", "Once", stream=True, max_tokens=3000, temperature=0)
        n = 0
        for _ in s:
            n += 1
            if n == 1:
                self.c.cancel()
        self.assertIn(s.finish_reason, ("cancelled", "eos"))
        if s.finish_reason == "cancelled":
            self.assertLess(s.done["usage"]["completion_tokens"], 3000)
        self.assertEqual(self.c.generate("m0", "hi", max_tokens=2)["event"], "done")

    def test_cancel_from_another_thread(self):
        s = self.c.generate("big", "Once", stream=True, max_tokens=3000, temperature=0)
        first = next(s)
        self.assertIsInstance(first, str)
        t = threading.Thread(target=s.cancel)
        t.start()
        t.join()
        rest = list(s)
        self.assertIn(s.finish_reason, ("cancelled", "eos"))
        self.assertEqual(first + "".join(rest), s.text)

    def test_a_stream_closed_early_leaves_the_client_usable(self):
        with self.c.generate("big", "Once", stream=True, max_tokens=3000, temperature=0) as s:
            next(s)
        self.assertIsNone(s.done)
        done = self.c.generate("m0", "Once upon a time", max_tokens=4, temperature=0)
        self.assertEqual(done["usage"]["completion_tokens"], 4)

    def test_a_second_request_in_the_streaming_thread_is_refused(self):
        s = self.c.generate("m0", "Once", stream=True, max_tokens=4)
        with self.assertRaises(RuntimeError):
            self.c.models()
        list(s)
        self.assertTrue(self.c.models())

    def test_threads_sharing_a_client_are_serialised(self):
        want = self.c.generate("m0", "The cat", max_tokens=6, temperature=0)["text"]
        got, errors = [], []

        def work():
            try:
                for _ in range(3):
                    got.append(self.c.generate("m0", "The cat", max_tokens=6, temperature=0)["text"])
            except Exception as e:  # collected for the assertion
                errors.append(e)

        ts = [threading.Thread(target=work) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        self.assertEqual(errors, [])
        self.assertEqual(got, [want] * 12)

    def test_a_long_prompt_is_sent_and_answered(self):
        prompt = "hello world " * 20000  # a 240 KB line, under the 1 MiB max_line
        with self.assertRaises(gpuswap.GpuswapError) as cm:
            self.c.generate("m0", prompt, max_tokens=1)
        self.assertEqual(cm.exception.code, "context_overflow")
        ids = self.c.tokenize("m0", prompt)
        self.assertGreater(len(ids), 4096)

    def test_a_line_over_max_line_raises_too_large_and_the_client_reconnects(self):
        with self.assertRaises(gpuswap.GpuswapError) as cm:
            self.c.generate("m0", "x" * (2 << 20), max_tokens=1)
        self.assertEqual(cm.exception.code, "too_large")
        self.assertEqual(self.c.generate("m0", "hi", max_tokens=2)["event"], "done")


class Admin(unittest.TestCase):
    def setUp(self):
        self.c = client()

    def tearDown(self):
        self.c.close()

    def test_stats_has_pool_and_per_model_counters(self):
        self.c.generate("m0", "hi", max_tokens=2)
        st = self.c.stats()
        self.assertTrue(st["ok"])
        for k in ("page_size", "curr_pool_pages", "curr_pool_used", "curr_pool_free"):
            self.assertIn(k, st["pool"])
        m = st["models"]["m0"]
        for k in ("state", "curr_resident_bytes", "gpu_quota", "total_page_ins", "evictions_capacity",
                  "evictions_quota", "evictions_admin", "evictions_preemption", "total_hits",
                  "total_misses", "curr_queued", "ttft_ms_p50", "ttft_ms_p99"):
            self.assertIn(k, m)
        self.assertGreaterEqual(m["total_requests"], 1)

    def test_evict_then_load_with_progress_pages_the_model_back(self):
        self.c.unpin("q0")
        self.c.load("q0")
        ev = self.c.evict("q0")
        self.assertGreater(ev["bytes_evicted"], 0)
        self.assertEqual(self.c.stats()["models"]["q0"]["curr_resident_bytes"], 0)
        seen = []
        ans = self.c.load("q0", progress=lambda b, t: seen.append((b, t)))
        self.assertEqual(ans["state"], "resident")
        self.assertGreater(ans["bytes"], 0)
        for b, t in seen:
            self.assertLessEqual(b, t)
        st = self.c.stats()["models"]["q0"]
        self.assertEqual(st["curr_resident_bytes"], ans["bytes"])
        self.assertGreaterEqual(st["evictions_admin"], 1)

    def test_a_pinned_model_cannot_be_evicted_until_unpinned(self):
        self.assertTrue(self.c.pin("m0")["pinned"])
        try:
            self.c.load("m0")
            with self.assertRaises(gpuswap.GpuswapError) as cm:
                self.c.evict("m0")
            self.assertEqual(cm.exception.code, "bad_request")
        finally:
            self.assertFalse(self.c.unpin("m0")["pinned"])
        self.c.evict("m0")

    def test_admin_ops_on_an_unknown_model_raise(self):
        for op in (self.c.load, self.c.evict, self.c.pin, self.c.unpin):
            with self.assertRaises(gpuswap.GpuswapError) as cm:
                op("nope")
            self.assertEqual(cm.exception.code, "unknown_model")

    def test_reload_of_an_unchanged_config_changes_nothing(self):
        ans = self.c.reload()
        self.assertEqual((ans["added"], ans["removed"], ans["changed"]), ([], [], []))


class Connection(unittest.TestCase):
    def test_no_daemon_raises_connection_error(self):
        c = gpuswap.Client(socket_path="/nonexistent/gpuswapd.sock", admin_socket="/nonexistent/a.sock")
        with self.assertRaises(ConnectionError):
            c.models()
        with self.assertRaises(ConnectionError):
            c.stats()
        with self.assertRaises(ConnectionError):
            c.generate("m0", "hi", stream=True)
        with self.assertRaises(ConnectionError):  # the lock was released after the failure
            c.models()

    def test_environment_variables_name_the_sockets(self):
        old = dict(os.environ)
        try:
            os.environ["GPUSWAP_SOCKET"] = D.sock
            os.environ["GPUSWAP_ADMIN_SOCKET"] = D.admin
            c = gpuswap.Client()
            self.assertTrue(c.models())
            self.assertTrue(c.stats()["ok"])
            c.close()
        finally:
            os.environ.clear()
            os.environ.update(old)


def main():
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[__name__])
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(result.failures) + len(result.errors)
    passed = result.testsRun - failed - len(result.skipped)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed or not result.wasSuccessful() else 0


if __name__ == "__main__":
    sys.exit(main())
