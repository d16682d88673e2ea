#!/usr/bin/env node
// ce_check.js: reads what a CloudEvents consumer got, one JSON line each,
// and parses it with the official CloudEvents SDK (npm `cloudevents`,
// installed from test/verify/package-lock.json by test/install-deps.sh),
// validation on, independently of the extension's C:
//
//   {"binding": "http", "headers": {name: value}, "body": text}
//       HTTP.toEvent(): binary, structured or batched content mode
//   {"binding": "kafka", "headers": {...}, "key": text|null, "body": text}
//       Kafka.toEvent(): binary or structured mode
//   {"binding": "nats", "headers": {...}, "body": text}
//       the SDK has no NATS binding: binary mode (ce- headers) is mapped to
//       attributes here as the NATS binding says, structured mode parsed as
//       application/cloudevents+json; the event is built and validated by
//       the SDK's CloudEvent class
//
//   {"binding": "amqp", "headers": {...}, "content_type": text, "body": text}
//       the SDK has no AMQP binding either: binary mode (cloudEvents:
//       headers, the content-type property) is mapped as the CloudEvents
//       AMQP binding says, structured mode parsed as
//       application/cloudevents+json
//   {"binding": "redis", "body": text}
//       no binding: the structured event, one stream entry's field
//
//   node test/verify/ce_check.js < in.jsonl > out.jsonl
//
// Prints one line per input line: {"ok": true, "events": [event as JSON,
// ...]} or {"ok": false, "error": "..."}.  Exits non-zero when the SDK is
// missing: the test then fails, it does not skip.
"use strict";

const readline = require("readline");

let sdk;
try {
	sdk = require("cloudevents");
} catch (e) {
	console.error("ce_check: the cloudevents package is missing (run test/install-deps.sh)");
	process.exit(2);
}
const { HTTP, Kafka, CloudEvent } = sdk;

function asArray(x) {
	return Array.isArray(x) ? x : [x];
}

// Validated JSON of an event: the SDK's own toJSON(), after validate().
function plain(ev) {
	if (!ev.validate()) throw new Error("the event does not validate");
	return ev.toJSON();
}

function parse(rec) {
	const headers = rec.headers || {};
	if (rec.binding === "http") {
		return asArray(HTTP.toEvent({ headers, body: rec.body })).map(plain);
	}
	if (rec.binding === "kafka") {
		const msg = { headers, body: rec.body, value: rec.body };
		if (rec.key !== null && rec.key !== undefined) msg.key = rec.key;
		return asArray(Kafka.toEvent(msg)).map(plain);
	}
	if (rec.binding === "nats") {
		const ct = headers["content-type"] || headers["Content-Type"] || "";
		if (ct.startsWith("application/cloudevents+json")) {
			return asArray(HTTP.toEvent({ headers: { "content-type": ct }, body: rec.body })).map(plain);
		}
		const attrs = {};
		for (const [name, value] of Object.entries(headers)) {
			const n = name.toLowerCase();
			if (n.startsWith("ce-")) attrs[n.slice(3)] = value;
		}
		if (ct) attrs.datacontenttype = ct;
		attrs.data = ct.startsWith("application/json") ? JSON.parse(rec.body) : rec.body;
		return [plain(new CloudEvent(attrs, true))];
	}
	if (rec.binding === "amqp") {
		const ct = rec.content_type || "";
		if (ct.startsWith("application/cloudevents+json")) {
			return asArray(HTTP.toEvent({ headers: { "content-type": ct }, body: rec.body })).map(plain);
		}
		const attrs = {};
		for (const [name, value] of Object.entries(headers)) {
			if (name.startsWith("cloudEvents:")) attrs[name.slice(12)] = value;
		}
		if (ct) attrs.datacontenttype = ct;
		attrs.data = ct.startsWith("application/json") ? JSON.parse(rec.body) : rec.body;
		return [plain(new CloudEvent(attrs, true))];
	}
	if (rec.binding === "redis") {
		return asArray(HTTP.toEvent({ headers: { "content-type": "application/cloudevents+json" },
			body: rec.body })).map(plain);
	}
	throw new Error("unknown binding " + rec.binding);
}

const rl = readline.createInterface({ input: process.stdin });
rl.on("line", (line) => {
	if (!line.trim()) return;
	let out;
	try {
		out = { ok: true, events: parse(JSON.parse(line)) };
	} catch (e) {
		out = { ok: false, error: String(e && e.message ? e.message : e) };
	}
	process.stdout.write(JSON.stringify(out) + "\n");
});
