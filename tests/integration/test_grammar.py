"""The grammar field end to end on the real daemon (sim backend, a generated model): outputs of a
yes/no grammar and of an arithmetic-expression grammar, over the socket (whole and streamed) and
HTTP, belong to their languages; malformed grammars are bad_request naming line and column, and
grammar beside response_format is refused."""
import http.client
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-grammar-")
SHAPE = "--type f16 --dim 64 --layers 2 --heads 2 --kv-heads 1 --ff 128 --vocab 600 --seed 11"
PATH = gsd.mkmodel(os.path.join(TMP, "m.gguf"), SHAPE)
PORT = gsd.free_port()
D = None
SEEDS = (1, 2, 3, 4)

YESNO = 'root ::= ("yes" | "no") "."'
ARITH = r"""# integer arithmetic, a bounded number of terms
root   ::= expr
expr   ::= term (("+" | "-") term){0,3}
term   ::= factor ([*/] factor){0,2}
factor ::= [0-9]{1,3} | "(" expr ")"
"""


def arith_ok(s):
    """Whether s is in ARITH's language (a recursive descent mirroring the grammar)."""
    pos = 0

    def factor():
        nonlocal pos
        m = re.match(r"[0-9]{1,3}", s[pos:])
        if m:
            pos += len(m.group(0))
            return pos >= len(s) or not s[pos].isdigit()
        if s[pos:pos + 1] == "(":
            pos += 1
            if not expr() or s[pos:pos + 1] != ")":
                return False
            pos += 1
            return True
        return False

    def term():
        nonlocal pos
        if not factor():
            return False
        for _ in range(2):
            if s[pos:pos + 1] not in ("*", "/") or pos >= len(s):
                break
            pos += 1
            if not factor():
                return False
        return True

    def expr():
        nonlocal pos
        if not term():
            return False
        for _ in range(3):
            if s[pos:pos + 1] not in ("+", "-") or pos >= len(s):
                break
            pos += 1
            if not term():
                return False
        return True

    return expr() and pos == len(s)


def http_post(path, body):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=gsd.scaled(120))
    try:
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


def gen(c, rid, grammar, seed, **kw):
    req = {"op": "generate", "id": rid, "model": "m", "prompt": "Q:", "max_tokens": 400,
           "temperature": 1, "seed": seed, "top_k": 0, "top_p": 1, "min_p": 0, "grammar": grammar}
    req.update(kw)
    return c.call(req)


# ------------------------------------------------------------------ tests


def yes_no_outputs_are_yes_or_no():
    c = D.client(timeout=gsd.scaled(120))
    for seed in SEEDS:
        ev = gen(c, seed, YESNO, seed)
        assert ev.get("event") == "done", ev
        assert ev["finish_reason"] == "eos", ev
        assert ev["text"] in ("yes.", "no."), ev
    c.close()


def arithmetic_outputs_parse():
    c = D.client(timeout=gsd.scaled(120))
    eos = 0
    for seed in SEEDS:
        ev = gen(c, seed, ARITH, seed)
        assert ev.get("event") == "done", ev
        if os.environ.get("SHOW"):
            print(seed, ev["finish_reason"], repr(ev["text"]))
        if ev["finish_reason"] == "eos":
            assert arith_ok(ev["text"]), ev["text"]
            eos += 1
        else:  # cut short by max_tokens: a prefix in the grammar's alphabet
            assert ev["finish_reason"] == "length" and re.fullmatch(r"[0-9+\-*/()]*", ev["text"]), ev
    assert eos >= 2, "most expressions end"
    # streamed: the token events add up to the text
    c.send({"op": "generate", "id": "s", "model": "m", "prompt": "Q:", "max_tokens": 400,
            "temperature": 1, "seed": 5, "stream": True, "grammar": ARITH})
    done, toks = c.final("s")
    c.close()
    text = "".join(t["text"] for t in toks)
    assert done["finish_reason"] != "eos" or arith_ok(text), text


def http_completions_follow_the_grammar():
    status, body = http_post("/v1/completions", {"model": "m", "prompt": "Q:", "max_tokens": 50,
                                                 "seed": 3, "grammar": YESNO})
    assert status == 200, body
    assert body["choices"][0]["text"] in ("yes.", "no."), body
    status, body = http_post("/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": "ok?"}], "max_tokens": 50, "seed": 2,
        "grammar": YESNO})
    assert status == 200, body
    assert body["choices"][0]["message"]["content"] in ("yes.", "no."), body


def bad_grammars_are_refused_with_line_and_column():
    c = D.client()
    cases = [
        ('root ::= "yes" | "no', "grammar: line 1 column 18: unterminated string literal"),
        ("root ::= a\n", "grammar: line 1 column 10: undefined rule 'a'"),
        ('start ::= "x"', "grammar: the grammar has no 'root' rule"),
        ('root ::= e\ne ::= e "+" [0-9] | [0-9]', "grammar: line 2 column 1: rule 'e' is left-recursive"),
    ]
    for i, (g, want) in enumerate(cases):
        ev = c.call({"op": "generate", "id": i, "model": "m", "prompt": "x", "grammar": g})
        assert ev.get("error", {}).get("code") == "bad_request", ev
        assert ev["error"]["message"].startswith(want), (ev, want)
    ev = c.call({"op": "generate", "id": 9, "model": "m", "prompt": "x", "grammar": YESNO,
                 "response_format": {"type": "json_object"}})
    assert ev["error"]["code"] == "bad_request" and "not both" in ev["error"]["message"], ev
    ev = c.call({"op": "generate", "id": 10, "model": "m", "prompt": "x", "grammar": 3})
    assert ev["error"]["code"] == "bad_request" and "grammar" in ev["error"]["message"], ev
    c.close()
    status, body = http_post("/v1/completions", {"model": "m", "prompt": "x", "grammar": "root ::= ("})
    assert status == 400 and "grammar: line 1 column 10" in body["error"]["message"], (status, body)


def main():
    global D
    D = gsd.Daemon([("m", PATH, "")], memory="8MiB", listen="http: 127.0.0.1:%d" % PORT)
    r = gsd.Runner()
    try:
        for fn in (yes_no_outputs_are_yes_or_no, arithmetic_outputs_parse,
                   http_completions_follow_the_grammar, bad_grammars_are_refused_with_line_and_column):
            r.run(fn)
    finally:
        assert D.stop() == 0
    return r.exit_code()


if __name__ == "__main__":
    sys.exit(main())
