#!/usr/bin/env node
// receiver.js: a webhook receiver for test/t/034_signatures.pl that checks
// the relay's signatures with implementations independent of the
// extension's C:
//   v1  (whsec_, HMAC-SHA256) with the Standard Webhooks npm library
//       `standardwebhooks` (installed from test/verify/package-lock.json by
//       test/install-deps.sh), its Webhook class's verify();
//   v1a (whsk_, ed25519) with Python's `cryptography` (Debian's
//       python3-cryptography), through ed25519_helper.py as a co-process,
//       given only the whpk_ public key.
//
//   node test/verify/receiver.js --port-file F --record F [--python P]
//
// Every path starts with no keys.  POST /_keys {"path": "/x",
// "keys": {"label": "whsec_..." | "whpk_...", ...}, "accept": [labels]}
// sets the keys of a path.  Every signature of a request (webhook-signature
// holds one or more, space-separated) is checked against every key of its
// kind, each on its own: a v1 one with a Webhook of that key alone, a v1a
// one with that public key.  The request is answered 200 when one of its
// signatures verifies with an accepted key and its timestamp is within the
// spec's 5 minutes, else 401 (as a Standard Webhooks receiver would:
// during a key rotation it accepts either key).  The library's verdict on
// the whole header is recorded too.
//
// Each request is appended to the record file, one JSON line, before it is
// answered (so the lines of one key come in delivery order):
//   {"seq": n, "t": seconds, "path": ..., "status": 200|401,
//    "headers": {lower-cased name: value}, "body": text, "body_b64": ...,
//    "sigs": [{"sig": "v1,...", "version": "v1", "verified_by": [labels]}],
//    "lib_accepts": [labels whose Webhook.verify() accepted the request],
//    "verified_by": [labels], "reason": why it was refused, or null}
// GET /_stats answers {"requests": n, "by_status": {...}}.
//
// Before it listens, the receiver checks both implementations against
// published test vectors (RFC 8032's first ed25519 vector, the Standard
// Webhooks spec's v1 example) and exits non-zero if either fails, or if
// the library or the helper is missing: the test then fails, it does not
// skip.
"use strict";

const child_process = require("child_process");
const fs = require("fs");
const http = require("http");
const path = require("path");
const readline = require("readline");

let Webhook;
try {
	({ Webhook } = require("standardwebhooks"));
} catch (e) {
	console.error(
		"receiver.js: the npm package standardwebhooks is missing (" +
			e.message +
			"): run test/install-deps.sh as root (npm ci in test/verify)",
	);
	process.exit(3);
}

const TOLERANCE = 5 * 60;

function parseArgs(argv) {
	const a = { python: null, portFile: null, record: null };
	for (let i = 2; i < argv.length; i++) {
		if (argv[i] === "--port-file") a.portFile = argv[++i];
		else if (argv[i] === "--record") a.record = argv[++i];
		else if (argv[i] === "--python") a.python = argv[++i];
		else {
			console.error("receiver.js: unknown argument " + argv[i]);
			process.exit(2);
		}
	}
	if (!a.portFile || !a.record) {
		console.error("usage: receiver.js --port-file F --record F [--python P]");
		process.exit(2);
	}
	if (!a.python) a.python = fs.existsSync("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
	return a;
}

const args = parseArgs(process.argv);

// --- the Python co-process ---
const helper = child_process.spawn(args.python, [path.join(__dirname, "ed25519_helper.py")], {
	stdio: ["pipe", "pipe", "inherit"],
});
const pending = new Map();
let nextTag = 1;
helper.on("exit", (code, signal) => {
	console.error(`receiver.js: ed25519_helper.py exited (${code ?? signal})`);
	process.exit(4);
});
helper.on("error", (e) => {
	console.error("receiver.js: cannot run ed25519_helper.py: " + e.message);
	process.exit(4);
});
readline.createInterface({ input: helper.stdout }).on("line", (line) => {
	const ans = JSON.parse(line);
	const p = pending.get(ans.tag);
	if (!p) return;
	pending.delete(ans.tag);
	p(ans);
});

function helperCall(req) {
	return new Promise((resolve) => {
		req.tag = nextTag++;
		pending.set(req.tag, resolve);
		helper.stdin.write(JSON.stringify(req) + "\n");
	});
}

async function verifyV1a(publicKey, msg, sigB64) {
	const ans = await helperCall({
		op: "verify",
		public_key: publicKey,
		msg_b64: msg.toString("base64"),
		sig_b64: sigB64,
	});
	return ans.ok === true;
}

// --- self-test against published vectors ---
async function selfTest() {
	// RFC 8032, 7.1, TEST 1 (empty message).
	const pub = Buffer.from("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "hex");
	const sig = Buffer.from(
		"e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
		"hex",
	);
	const pk = "whpk_" + pub.toString("base64");
	if (!(await verifyV1a(pk, Buffer.alloc(0), sig.toString("base64"))))
		throw new Error("ed25519_helper.py rejects RFC 8032's test vector 1");
	const bad = Buffer.from(sig);
	bad[0] ^= 1;
	if (await verifyV1a(pk, Buffer.alloc(0), bad.toString("base64")))
		throw new Error("ed25519_helper.py accepts a corrupted signature");
	// The Standard Webhooks spec's example.
	const wh = new Webhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
	const s = wh.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", new Date(1614265330 * 1000), '{"test": 2432232314}');
	if (s !== "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
		throw new Error("standardwebhooks signs the spec's example as " + s);
}

// --- per-path keys ---
const config = new Map(); // path -> {keys: [{label, kind, key, wh}], accept: Set}

function setKeys(req) {
	if (typeof req.path !== "string") throw new Error("path missing");
	const keys = [];
	for (const [label, key] of Object.entries(req.keys || {})) {
		if (typeof key !== "string") throw new Error(`key ${label} is not text`);
		if (key.startsWith("whsec_")) keys.push({ label, kind: "v1", key, wh: new Webhook(key) });
		else if (key.startsWith("whpk_")) keys.push({ label, kind: "v1a", key });
		else throw new Error(`key ${label} is neither whsec_ nor whpk_`);
	}
	const accept = new Set(req.accept === undefined ? keys.map((k) => k.label) : req.accept);
	for (const l of accept) if (!keys.some((k) => k.label === l)) throw new Error(`accepted key ${l} is not a key`);
	config.set(req.path, { keys, accept });
	return { path: req.path, keys: keys.map((k) => k.label), accept: [...accept] };
}

async function verifyRequest(p, headers, body) {
	const cfg = config.get(p) || { keys: [], accept: new Set() };
	const id = headers["webhook-id"];
	const ts = headers["webhook-timestamp"];
	const header = headers["webhook-signature"];
	const out = { sigs: [], lib_accepts: [], verified_by: [], reason: null };
	if (!id || !ts || !header) {
		out.reason = "missing webhook-id, webhook-timestamp or webhook-signature";
		return out;
	}
	const signed = Buffer.concat([Buffer.from(`${id}.${ts}.`, "utf8"), body]);
	for (const entry of header.split(" ")) {
		const comma = entry.indexOf(",");
		const version = comma < 0 ? entry : entry.slice(0, comma);
		const r = { sig: entry, version, verified_by: [] };
		for (const k of cfg.keys) {
			if (k.kind !== version) continue;
			let ok = false;
			if (version === "v1") {
				// The library on this signature alone.
				try {
					k.wh.verify(body, {
						"webhook-id": id,
						"webhook-timestamp": ts,
						"webhook-signature": entry,
					}, { jsonParse: false });
					ok = true;
				} catch (e) {
					ok = false;
				}
			} else {
				ok = await verifyV1a(k.key, signed, entry.slice(comma + 1));
			}
			if (ok) r.verified_by.push(k.label);
		}
		out.sigs.push(r);
		for (const l of r.verified_by) if (!out.verified_by.includes(l)) out.verified_by.push(l);
	}
	// The library's own verdict on the whole header (v1 keys only).
	for (const k of cfg.keys) {
		if (k.kind !== "v1") continue;
		try {
			k.wh.verify(body, headers, { jsonParse: false });
			out.lib_accepts.push(k.label);
		} catch (e) {}
	}
	const now = Math.floor(Date.now() / 1000);
	const t = Number.parseInt(ts, 10);
	if (!/^[0-9]+$/.test(ts) || Math.abs(now - t) > TOLERANCE) out.reason = "webhook-timestamp is not now";
	else if (!out.verified_by.some((l) => cfg.accept.has(l)))
		out.reason = cfg.keys.length === 0 ? "no keys for this path" : "no signature verifies with an accepted key";
	return out;
}

// --- the server ---
let seq = 0;
const stats = { requests: 0, by_status: {} };
fs.writeFileSync(args.record, "");

function answer(res, status, obj) {
	const text = JSON.stringify(obj);
	res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
	res.end(text);
}

const server = http.createServer((req, res) => {
	const chunks = [];
	req.on("data", (c) => chunks.push(c));
	req.on("end", async () => {
		const body = Buffer.concat(chunks);
		const p = req.url.split("?")[0];
		try {
			if (p === "/_keys" && req.method === "POST") return answer(res, 200, setKeys(JSON.parse(body.toString("utf8"))));
			if (p === "/_stats") return answer(res, 200, stats);
		} catch (e) {
			return answer(res, 400, { error: e.message });
		}
		const v = await verifyRequest(p, req.headers, body);
		const status = v.reason === null ? 200 : 401;
		const rec = {
			seq: ++seq,
			t: Date.now() / 1000,
			method: req.method,
			path: p,
			status,
			headers: req.headers,
			body: body.toString("utf8"),
			body_b64: body.toString("base64"),
			...v,
		};
		fs.appendFileSync(args.record, JSON.stringify(rec) + "\n");
		stats.requests++;
		stats.by_status[status] = (stats.by_status[status] || 0) + 1;
		answer(res, status, { ok: status === 200, reason: v.reason });
	});
});
server.keepAliveTimeout = 60000;

function stop() {
	server.close();
	helper.removeAllListeners("exit");
	helper.kill();
	process.exit(0);
}
process.on("SIGTERM", stop);
process.on("SIGINT", stop);

selfTest()
	.then(() => {
		server.listen(0, "127.0.0.1", () => {
			const tmp = args.portFile + ".tmp";
			fs.writeFileSync(tmp, String(server.address().port));
			fs.renameSync(tmp, args.portFile);
		});
	})
	.catch((e) => {
		console.error("receiver.js: self-test failed: " + e.message);
		process.exit(5);
	});
