// The schema corpus bench (tests/bench/run_schemas.sh): argv BASE_URL MODEL CORPUS.json OUT_DIR.
// Sends each corpus schema as response_format json_schema to /v1/chat/completions once per seed (SEEDS, default 5;
// temperature 1, max_tokens MAX_TOKENS, default 256) and validates every output that finished with "stop" with ajv.
// Writes OUT_DIR/schemas.csv (one row a request) and OUT_DIR/schemas.json (the counts and the refusals);
// prints the summary. Exit status 1 when a finished output fails validation or a request fails otherwise.
import { readFileSync, writeFileSync } from "node:fs";
import Ajv from "ajv";
import Ajv04 from "ajv-draft-04";
import addFormats from "ajv-formats";

const [baseURL, model, corpusPath, outDir] = process.argv.slice(2);
const seeds = Number(process.env.SEEDS ?? 5);
const maxTokens = Number(process.env.MAX_TOKENS ?? 256);
const parallel = Number(process.env.PARALLEL ?? 4);
const corpus = JSON.parse(readFileSync(corpusPath, "utf8"));

// Each schema is validated under its own draft: draft-04 ones (their $schema says so, or they name
// themselves with draft 4's "id") by ajv-draft-04, the rest by ajv's default draft (07). The
// $schema is dropped from the copy ajv compiles (no meta-schema lookups). Formats are checked by
// ajv-formats (the daemon enforces date, time, date-time, email, hostname, ipv4, uuid and uri).
const opts = { strict: false, allErrors: true };
const ajv = addFormats(new Ajv(opts));
const ajv04 = addFormats(new Ajv04(opts));
function validator(schema) {
  const copy = structuredClone(schema);
  let v = ajv;
  if (copy && typeof copy === "object") {
    if (/draft-04/.test(String(copy.$schema ?? "")) || typeof copy.id === "string") v = ajv04;
    delete copy.$schema;
  }
  try {
    return v.compile(copy);
  } catch (e) {
    return { error: String(e.message ?? e) };
  }
}

async function ask(schema, seed) {
  const body = {
    model, seed, temperature: 1, max_tokens: maxTokens,
    messages: [{ role: "user", content: "Reply with a JSON document." }],
    response_format: { type: "json_schema", json_schema: { name: "s", schema, strict: true } },
  };
  const r = await fetch(`${baseURL}/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

// The keyword a refusal names ("keyword 'format' is not supported"), or its reason with the pointer taken out.
function refusalKind(msg) {
  const k = /keyword '([^']+)'/.exec(msg);
  if (k) return `keyword ${k[1]}${/ beside /.test(msg) ? " beside " + /beside '([^']+)'/.exec(msg)[1] : ""}`;
  return msg.replace(/^response_format: \S*: /, "").replace(/branch \d+/, "branch N").replace(/'[^']*'/g, "'...'");
}

// Every part that keeps a refused schema out, not only the first: the refused keyword is cut out at the pointer the
// refusal names and the rest asked again (max_tokens 1), until the daemon takes it or refuses something that is
// not a keyword (a union, uniqueItems true ...), which ends the list.
async function blockers(schema, msg) {
  const copy = structuredClone(schema), found = [];
  for (let i = 0; i < 64 && msg; i++) {
    found.push(refusalKind(msg));
    const m = /^response_format: (\S*): keyword '([^']+)'/.exec(msg);
    if (!m) break;
    let node = copy;
    for (const part of m[1].split("/").slice(1, -1)) node = node?.[part.replace(/~1/g, "/").replace(/~0/g, "~")];
    if (!node || typeof node !== "object" || !(m[2] in node)) break;
    delete node[m[2]];
    const body = { model, max_tokens: 1, messages: [{ role: "user", content: "x" }], response_format: { type: "json_schema", json_schema: { name: "s", schema: copy } } };
    const r = await fetch(`${baseURL}/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    const b = await r.json();
    msg = r.status === 400 ? b?.error?.message : null;
  }
  return [...new Set(found)];
}

const rows = [];
const refused = [];
const counts = { schemas: corpus.schemas.length, refused: 0, requests: 0, valid: 0, invalid: 0, length: 0, errors: 0 };
let failed = false;

async function runSchema(entry) {
  const first = await ask(entry.schema, 1);
  if (first.status === 400) {
    const msg = first.body?.error?.message ?? JSON.stringify(first.body);
    counts.refused++;
    refused.push({ id: entry.id, kind: refusalKind(msg), message: msg, blockers: await blockers(entry.schema, msg) });
    rows.push([entry.id, "", "refused", "", JSON.stringify(msg)]);
    return;
  }
  const v = validator(entry.schema);
  for (let seed = 1; seed <= seeds; seed++) {
    const r = seed === 1 ? first : await ask(entry.schema, seed);
    counts.requests++;
    if (r.status !== 200) {
      counts.errors++;
      failed = true;
      rows.push([entry.id, seed, "error", r.status, JSON.stringify(JSON.stringify(r.body))]);
      continue;
    }
    const ch = r.body.choices[0];
    const tokens = r.body.usage?.completion_tokens ?? "";
    if (ch.finish_reason !== "stop") {
      counts.length++;
      rows.push([entry.id, seed, ch.finish_reason, tokens, ""]);
      continue;
    }
    let ok = false, why = "";
    try {
      const doc = JSON.parse(ch.message.content);
      if (v.error) why = "ajv: " + v.error;
      else if (!(ok = v(doc))) why = ajv.errorsText(v.errors);
    } catch (e) {
      why = "not JSON: " + e.message;
    }
    if (ok) counts.valid++;
    else {
      counts.invalid++;
      failed = true;
      console.error(`INVALID ${entry.id} seed ${seed}: ${why}\n  ${ch.message.content}`);
    }
    rows.push([entry.id, seed, ok ? "valid" : "invalid", tokens, JSON.stringify(why)]);
  }
}

const queue = [...corpus.schemas];
await Promise.all(Array.from({ length: parallel }, async () => {
  for (let e; (e = queue.shift()); ) await runSchema(e);
}));

rows.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : Number(a[1]) - Number(b[1])));
writeFileSync(`${outDir}/schemas.csv`, "schema,seed,outcome,completion_tokens,detail\n" + rows.map((r) => r.join(",")).join("\n") + "\n");
const byKind = {};
for (const r of refused) (byKind[r.kind] ??= []).push(r.id);
const kinds = Object.entries(byKind).sort((a, b) => b[1].length - a[1].length || (a[0] < b[0] ? -1 : 1));
refused.sort((a, b) => (a.id < b.id ? -1 : 1));
const all = {};
for (const r of refused) for (const k of r.blockers) all[k] = (all[k] ?? 0) + 1;
writeFileSync(`${outDir}/schemas.json`, JSON.stringify({ counts, seeds, max_tokens: maxTokens, refusals: kinds.map(([k, ids]) => ({ kind: k, count: ids.length, schemas: ids })), blockers: all, refused }, null, 1) + "\n");

const pct = (a, b) => (b ? ((100 * a) / b).toFixed(1) : "0.0");
console.log(`schemas: ${counts.schemas}, refused ${counts.refused} (${pct(counts.refused, counts.schemas)}%; target at most 10%)`);
console.log(`requests: ${counts.requests} (${seeds} seeds x ${counts.schemas - counts.refused} accepted schemas, max_tokens ${maxTokens})`);
console.log(`  finished (stop) and valid: ${counts.valid}`);
console.log(`  finished (stop) and INVALID: ${counts.invalid}`);
console.log(`  cut by length: ${counts.length}`);
if (counts.errors) console.log(`  failed requests: ${counts.errors}`);
console.log("refusals by first refused keyword or reason (a schema counts once, for the first part the daemon names):");
for (const [k, ids] of kinds) console.log(`  ${String(ids.length).padStart(3)}  ${k}`);
console.log("every part that keeps a schema out (a schema counts once per kind; the schemas a kind alone keeps out):");
for (const [k, n] of Object.entries(all).sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)))
  console.log(`  ${String(n).padStart(3)}  ${k}  (alone: ${refused.filter((r) => r.blockers.length === 1 && r.blockers[0] === k).length})`);
const subsets = {};
for (const e of corpus.schemas) subsets[e.id.split("/")[0]] ??= { n: 0, refused: 0 };
for (const e of corpus.schemas) subsets[e.id.split("/")[0]].n++;
for (const r of refused) subsets[r.id.split("/")[0]].refused++;
console.log("by subset: " + Object.entries(subsets).map(([s, c]) => `${s} ${c.refused}/${c.n} refused`).join(", "));
process.exit(failed ? 1 : 0);
