"""Constrained decoding end to end on the real daemon (sim backend, a generated model): every output
for several schemas x seeds, over the socket and HTTP, parses as JSON and validates against its
schema (a small validator for the supported keywords below); refused schemas are bad_request
naming the part."""
import http.client
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-constrain-")
SHAPE = "--type f16 --dim 64 --layers 2 --heads 2 --kv-heads 1 --ff 128 --vocab 600 --seed 11"
PATH = gsd.mkmodel(os.path.join(TMP, "m.gguf"), SHAPE)
PORT = gsd.free_port()
D = None
SEEDS = (1, 2, 3)

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 8},
            "age": {"type": "integer"},
            "kind": {"enum": ["cat", "dog", None, 3]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "minItems": 1,
                     "maxItems": 3},
        },
        "required": ["name", "age", "kind", "tags"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "score": {"type": ["number", "null"]},
            "child": {"$ref": "#/$defs/leaf"},
            "opt": {"const": "x"},
        },
        "required": ["ok", "child"],
        "$defs": {"leaf": {"type": "object", "properties": {
            "id": {"type": "integer"}, "note": {"anyOf": [{"type": "string", "maxLength": 6},
                                                         {"type": "null"}]}},
            "required": ["id", "note"]}},
    },
    "list": {"type": "array", "items": {"type": "object", "properties": {
        "k": {"type": "string", "maxLength": 3}}, "required": ["k"]}, "minItems": 2, "maxItems": 3},
}


# ------------------------------------------------------------------ validator


def resolve(root, ref):
    node = root
    for part in ref.lstrip("#").split("/")[1:]:
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def is_type(v, t):
    return {"object": isinstance(v, dict), "array": isinstance(v, list), "string": isinstance(v, str),
            "integer": isinstance(v, int) and not isinstance(v, bool),
            "number": isinstance(v, (int, float)) and not isinstance(v, bool),
            "boolean": isinstance(v, bool), "null": v is None}[t]


def validate(v, s, root, path="$"):
    """Raises AssertionError where v breaks schema s (the keywords the daemon enforces)."""
    if s is True or s == {} or (v is None and s.get("nullable") is True):  # nullable: OpenAPI's
        return
    if "$ref" in s:
        return validate(v, resolve(root, s["$ref"]), root, path)
    if "anyOf" in s:
        errs = []
        for b in s["anyOf"]:
            try:
                return validate(v, b, root, path)
            except AssertionError as e:
                errs.append(str(e))
        raise AssertionError("%s: no anyOf branch fits: %s" % (path, errs))
    if "const" in s:
        assert v == s["const"] and type(v) is type(s["const"]), (path, v)
    if "enum" in s:
        assert any(v == e and type(v) is type(e) for e in s["enum"]), (path, v)
    if "type" in s:
        ts = s["type"] if isinstance(s["type"], list) else [s["type"]]
        assert any(is_type(v, t) for t in ts), (path, v, ts)
    if isinstance(v, dict):
        for k in s.get("required", []):
            assert k in v, (path, "missing", k)
        props = s.get("properties", {})
        for k, x in v.items():
            if k in props:
                validate(x, props[k], root, path + "." + k)
            else:
                assert s.get("additionalProperties", True) is not False, (path, "extra", k)
    if isinstance(v, list):
        assert len(v) >= s.get("minItems", 0) and len(v) <= s.get("maxItems", 1 << 30), (path, v)
        for i, x in enumerate(v):
            validate(x, s.get("items", {}), root, "%s[%d]" % (path, i))
    if isinstance(v, str):
        assert s.get("minLength", 0) <= len(v) <= s.get("maxLength", 1 << 30), (path, v)


def check_output(text, schema):
    try:
        v = json.loads(text)
    except ValueError as e:
        raise AssertionError("not JSON (%s): %r" % (e, text))
    if schema is None:
        assert isinstance(v, dict), text
    else:
        validate(v, schema, schema)
    return v


def rf(name):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


def http_post(path, body):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=gsd.scaled(120))
    try:
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


# ------------------------------------------------------------------ tests


def every_socket_output_validates_for_every_schema_and_seed():
    c = D.client(timeout=gsd.scaled(120))
    n = 0
    for name in SCHEMAS:
        for seed in SEEDS:
            ev = c.call({"op": "generate", "id": n, "model": "m", "prompt": "Data:", "max_tokens": 700,
                         "temperature": 1, "seed": seed, "top_k": 0, "top_p": 1, "min_p": 0,
                         "response_format": rf(name)})
            n += 1
            assert ev.get("event") == "done", ev
            assert ev["finish_reason"] == "eos", (name, seed, ev)
            check_output(ev["text"], SCHEMAS[name])
            if os.environ.get("SHOW"):
                print(name, seed, ev["usage"], repr(ev["text"]))
    # json_object, streamed: the token events add up to an object
    c.send({"op": "generate", "id": "o", "model": "m", "prompt": "Data:", "max_tokens": 400,
            "temperature": 1, "seed": 9, "stream": True, "response_format": {"type": "json_object"}})
    done, toks = c.final("o")
    c.close()
    if done["finish_reason"] == "eos":
        check_output("".join(t["text"] for t in toks), None)
    else:  # any object may run past max_tokens: then it is a prefix of one
        assert done["finish_reason"] == "length" and "".join(t["text"] for t in toks).lstrip()[0] == "{"


def http_chat_completions_follow_the_schema():
    for seed in SEEDS[:2]:
        status, body = http_post("/v1/chat/completions", {
            "model": "m", "messages": [{"role": "user", "content": "a tree"}], "max_tokens": 700,
            "seed": seed, "temperature": 1, "response_format": rf("nested")})
        assert status == 200, body
        check_output(body["choices"][0]["message"]["content"], SCHEMAS["nested"])
    status, body = http_post("/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": "a person"}], "max_tokens": 700,
        "seed": 4, "response_format": rf("person")})
    assert status == 200, body
    check_output(body["choices"][0]["message"]["content"], SCHEMAS["person"])


def unsupported_schemas_are_refused_naming_the_part():
    c = D.client()
    bad = {"type": "json_schema", "json_schema": {"name": "b", "schema": {
        "type": "object", "properties": {"when": {"type": "string", "format": "idn-hostname"}}}}}
    ev = c.call({"op": "generate", "id": 1, "model": "m", "prompt": "x", "response_format": bad})
    assert ev["error"]["code"] == "bad_request", ev
    assert "/properties/when/format" in ev["error"]["message"], ev
    ev = c.call({"op": "generate", "id": 2, "model": "m", "prompt": "x",
                 "response_format": {"type": "yaml"}})
    assert ev["error"]["code"] == "bad_request" and "response_format" in ev["error"]["message"], ev
    c.close()
    status, body = http_post("/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": bad})
    assert status == 400 and "/properties/when/format" in body["error"]["message"], (status, body)


def formats_patterns_and_integer_bounds_hold():
    """format, pattern and integer bounds over the socket: every finished output has them (checked
    here with Python's re and datetime, not with the daemon's own automata)."""
    import datetime
    import re
    schema = {"type": "object", "properties": {
        "when": {"type": "string", "format": "date-time"},
        "mail": {"type": "string", "format": "email"},
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
        "n": {"type": "integer", "minimum": -20, "exclusiveMaximum": 100}},
        "required": ["when", "mail", "code", "n"], "additionalProperties": False}
    c = D.client(timeout=gsd.scaled(120))
    done = 0
    for seed in range(1, 7):
        ev = c.call({"op": "generate", "id": seed, "model": "m", "prompt": "Data:", "max_tokens": 400,
                     "temperature": 1, "seed": seed,
                     "response_format": {"type": "json_schema",
                                         "json_schema": {"name": "f", "schema": schema}}})
        assert ev.get("event") == "done", ev
        if ev["finish_reason"] != "eos":
            continue  # unbounded parts (the e-mail's local part) may run past max_tokens
        done += 1
        v = json.loads(ev["text"])
        datetime.datetime.fromisoformat(v["when"].replace("Z", "+00:00"))  # raises if not RFC 3339
        assert re.fullmatch(r"[a-z0-9]+([._+-][a-z0-9]+)*@[a-z0-9]+(\.[a-z0-9]+)*\.[a-z]{2,6}",
                            v["mail"]), v
        assert re.fullmatch(r"[A-Z]{2}-[0-9]{3}", v["code"]), v
        assert isinstance(v["n"], int) and -20 <= v["n"] < 100, v
    c.close()
    assert done >= 2, "only %d of 6 outputs finished" % done


def openai_node_sdk_parses_zod_formats_streamed_and_not():
    """The pinned openai npm client (tests/node): zodResponseFormat through beta.chat.completions.parse
    and .stream; every parsed object passes the zod schema, and validates here against the JSON
    schema the helper sent."""
    node = shutil.which("node")
    if not node:
        print("skip: node not installed (the openai npm client test)")
        return
    node_dir = os.path.join(gsd.ROOT, "tests", "node")
    for pkg in ("openai", "zod"):
        assert os.path.isdir(os.path.join(node_dir, "node_modules", pkg)), \
            "the %s npm package is not in %s (make deps)" % (pkg, node_dir)
    out = subprocess.run([node, os.path.join(node_dir, "openai_structured.mjs"),
                          "http://127.0.0.1:%d/v1" % PORT, "m", ",".join(map(str, SEEDS))],
                         capture_output=True, text=True, timeout=gsd.scaled(120), cwd=node_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    schema = r["schema"]
    assert schema["properties"]["nickname"].get("nullable") is True, schema  # what the daemon met
    for part in ("parsed", "streamed"):
        assert len(r[part]) == len(SEEDS), r
        for c in r[part]:
            assert c["finish"] == "stop" and c["zod"], (part, c)
            assert c["parsed"] == json.loads(c["content"]), (part, c)
            check_output(c["content"], schema)
    assert all(c["deltas"] > 1 for c in r["streamed"]), r["streamed"]
    # the same seed gives the same document, streamed or not
    assert [c["content"] for c in r["parsed"]] == [c["content"] for c in r["streamed"]], r
    if os.environ.get("SHOW"):
        print("openai %s, zod %s:" % (r["openai"], r["zod"]), [c["content"] for c in r["parsed"]])


def main():
    global D
    D = gsd.Daemon([("m", PATH, "")], memory="8MiB", listen="http: 127.0.0.1:%d" % PORT)
    r = gsd.Runner()
    try:
        for fn in (every_socket_output_validates_for_every_schema_and_seed,
                   http_chat_completions_follow_the_schema,
                   unsupported_schemas_are_refused_naming_the_part,
                   formats_patterns_and_integer_bounds_hold,
                   openai_node_sdk_parses_zod_formats_streamed_and_not):
            r.run(fn)
    finally:
        assert D.stop() == 0
    return r.exit_code()


if __name__ == "__main__":
    sys.exit(main())
