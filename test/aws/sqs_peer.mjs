// An SQS endpoint for the tests: the emulator fauxqs (in this process, on
// a loopback port of its own) behind a front that checks every request's
// AWS Signature Version 4 with AWS's own signer (@smithy/signature-v4), the
// way SQS does, and answers as SQS does when it does not hold.  Both from
// test/verify's node_modules.
//
//   node sqs_peer.mjs PORT_FILE
//
// writes {"sqs": port, "control": port} to PORT_FILE once both listen.
// The control port (JSON in, JSON out):
//   POST /setup   {"region": r, "keys": {akid: secret, ...},
//                  "tokens": {akid: token}, "expired": [token, ...]}
//   POST /queue   {"name": n, "attributes": {...}}  -> {"url": ...}
//   POST /delete  {"name": n}                       (the queue is gone)
//   POST /fault   {"throttle": n, "error500": n, "marker": s, "marker_times": n}
//                  the next n requests throttled (400 ThrottlingException) or
//                  500 InternalError; entries whose body holds marker fail
//                  (SenderFault false, InternalError) marker_times times
//   GET  /drain?queue=n   every message now in the queue, received and
//                  deleted, in order: [{body, attrs, group, dedup, seq}]
//   GET  /stats   {"requests", "verified", "refused": {reason: n},
//                  "entries", "batches": [sizes]}
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const modules = path.join(here, '..', 'verify', 'node_modules');
const require = createRequire(path.join(modules, 'x.js'));
const { SignatureV4 } = require('@smithy/signature-v4');
const { Hash } = require('@smithy/hash-node');
const { buildApp } = await import(pathToFileURL(path.join(modules, 'fauxqs', 'dist', 'app.js')));

const config = { region: 'eu-west-1', keys: {}, tokens: {}, expired: [] };
const queues = {};   // name -> the URL fauxqs knows it by
const faults = { throttle: 0, error500: 0, marker: null, marker_times: 0 };
const stats = { requests: 0, verified: 0, refused: {}, entries: 0, batches: [] };

const app = buildApp({ logger: false });
await app.listen({ port: 0, host: '127.0.0.1' });
const innerPort = app.server.address().port;
let frontHost = null;

function refuse(res, status, type, message, reason) {
  stats.refused[reason] = (stats.refused[reason] || 0) + 1;
  res.writeHead(status, { 'content-type': 'application/x-amz-json-1.0' });
  res.end(JSON.stringify({ __type: type, message }));
}

// Check the request's signature as SQS would; an answer if it does not hold.
async function verify(req, body, res) {
  const auth = req.headers.authorization || '';
  const m = /^AWS4-HMAC-SHA256 Credential=([^/]+)\/(\d{8})\/([^/]+)\/([^/]+)\/aws4_request, SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})$/.exec(auth);
  if (!m) {
    refuse(res, 400, 'com.amazon.coral.service#IncompleteSignatureException', 'Authorization header is not AWS4-HMAC-SHA256', 'malformed');
    return false;
  }
  const [, akid, day, region, service, signedHeaders] = m;
  const secret = config.keys[akid];
  if (secret === undefined) {
    refuse(res, 400, 'com.amazon.coral.service#UnrecognizedClientException', 'The security token included in the request is invalid.', 'unknown key');
    return false;
  }
  const token = req.headers['x-amz-security-token'];
  if (config.tokens[akid] !== undefined) {
    if (token !== undefined && config.expired.includes(token)) {
      refuse(res, 400, 'com.amazonaws.sqs#ExpiredToken', 'The security token included in the request is expired', 'expired token');
      return false;
    }
    if (token !== config.tokens[akid]) {
      refuse(res, 400, 'com.amazon.coral.service#UnrecognizedClientException', 'The security token included in the request is invalid.', 'wrong token');
      return false;
    }
  }
  if (region !== config.region || service !== 'sqs') {
    refuse(res, 403, 'com.amazonaws.sqs#SignatureDoesNotMatch', `Credential should be scoped to a valid region (${config.region}) and service sqs`, 'scope');
    return false;
  }
  const amzDate = req.headers['x-amz-date'] || '';
  const dm = /^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z$/.exec(amzDate);
  if (!dm || amzDate.slice(0, 8) !== day) {
    refuse(res, 403, 'com.amazonaws.sqs#SignatureDoesNotMatch', 'X-Amz-Date is missing or not of the credential\'s day', 'date');
    return false;
  }
  const when = new Date(Date.UTC(+dm[1], +dm[2] - 1, +dm[3], +dm[4], +dm[5], +dm[6]));
  if (Math.abs(Date.now() - when.getTime()) > 5 * 60 * 1000) {
    refuse(res, 403, 'com.amazonaws.sqs#SignatureDoesNotMatch', 'Signature expired', 'skew');
    return false;
  }
  const names = signedHeaders.split(';');
  for (const need of ['host', 'x-amz-date']) {
    if (!names.includes(need)) {
      refuse(res, 403, 'com.amazonaws.sqs#SignatureDoesNotMatch', `${need} is not signed`, 'unsigned');
      return false;
    }
  }
  const headers = {};
  for (const n of names) {
    if (req.headers[n] === undefined) {
      refuse(res, 403, 'com.amazonaws.sqs#SignatureDoesNotMatch', `signed header ${n} is missing`, 'missing header');
      return false;
    }
    headers[n] = req.headers[n];
  }
  const signer = new SignatureV4({
    credentials: { accessKeyId: akid, secretAccessKey: secret, sessionToken: token },
    region, service, sha256: Hash.bind(null, 'sha256'), uriEscapePath: true, applyChecksum: false,
  });
  const [hostname, port] = req.headers.host.split(':');
  const signed = await signer.sign({
    method: req.method, protocol: 'http:', hostname, port: port ? +port : undefined,
    path: req.url.split('?')[0], query: {}, headers, body,
  }, { signingDate: when });
  if (signed.headers.authorization !== auth) {
    console.error(`signature mismatch: got ${auth} want ${signed.headers.authorization}`);
    refuse(res, 403, 'com.amazonaws.sqs#SignatureDoesNotMatch',
      'The request signature we calculated does not match the signature you provided.', 'signature');
    return false;
  }
  stats.verified++;
  return true;
}

// Pass a request to fauxqs as it came; its answer back.
function forward(req, body) {
  return new Promise((resolve, reject) => {
    const headers = { ...req.headers, 'content-length': Buffer.byteLength(body) };
    const r = http.request({ host: '127.0.0.1', port: innerPort, method: req.method, path: req.url, headers }, (a) => {
      const chunks = [];
      a.on('data', (c) => chunks.push(c));
      a.on('end', () => resolve({ status: a.statusCode, headers: a.headers, body: Buffer.concat(chunks).toString() }));
    });
    r.on('error', reject);
    r.end(body);
  });
}

const front = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', async () => {
    try {
      stats.requests++;
      let body = Buffer.concat(chunks).toString();
      if (!(await verify(req, body, res)))
        return;
      if (faults.throttle > 0) {
        faults.throttle--;
        refuse(res, 400, 'com.amazon.coral.availability#ThrottlingException', 'Rate exceeded', 'throttled');
        return;
      }
      if (faults.error500 > 0) {
        faults.error500--;
        refuse(res, 500, 'com.amazonaws.sqs#InternalError', 'We encountered an internal error. Please try again.', 'error500');
        return;
      }
      const target = req.headers['x-amz-target'];
      let failed = [];
      // fauxqs knows a queue by the URL it made; the relay by ours.
      const original = JSON.parse(body);
      const named = /^http:\/\/[^/]+\/(\d{12})\/([^/]+)$/.exec(original.QueueUrl || '');
      if (named && queues[named[2]]) {
        original.QueueUrl = queues[named[2]];
        body = JSON.stringify(original);
      }
      if (target === 'AmazonSQS.SendMessageBatch') {
        const request = JSON.parse(body);
        stats.entries += request.Entries.length;
        stats.batches.push(request.Entries.length);
        if (faults.marker && faults.marker_times > 0) {
          const keep = [];
          for (const e of request.Entries) {
            if (faults.marker_times > 0 && e.MessageBody.includes(faults.marker)) {
              faults.marker_times--;
              failed.push({ Id: e.Id, SenderFault: false, Code: 'InternalError', Message: 'injected failure of one entry' });
            } else {
              keep.push(e);
            }
          }
          if (failed.length > 0 && keep.length === 0) {
            res.writeHead(200, { 'content-type': 'application/x-amz-json-1.0' });
            res.end(JSON.stringify({ Successful: [], Failed: failed }));
            return;
          }
          request.Entries = keep;
          body = JSON.stringify(request);
        }
      }
      const a = await forward(req, body);
      let out = a.body;
      if (failed.length > 0 && a.status === 200) {
        const answer = JSON.parse(a.body);
        answer.Failed = (answer.Failed || []).concat(failed);
        out = JSON.stringify(answer);
      }
      res.writeHead(a.status, { 'content-type': a.headers['content-type'] || 'application/x-amz-json-1.0' });
      res.end(out);
    } catch (e) {
      res.writeHead(500, { 'content-type': 'text/plain' });
      res.end(String(e && e.stack || e));
    }
  });
});
await new Promise((r) => front.listen(0, '127.0.0.1', r));
frontHost = `127.0.0.1:${front.address().port}`;

async function sqs(action, params) {
  const r = await app.inject({
    method: 'POST', url: '/',
    headers: { host: frontHost, 'content-type': 'application/x-amz-json-1.0', 'x-amz-target': `AmazonSQS.${action}` },
    payload: JSON.stringify(params),
  });
  const answer = r.body ? JSON.parse(r.body) : {};
  if (r.statusCode !== 200)
    throw new Error(`${action}: ${r.statusCode} ${r.body}`);
  return answer;
}

async function drain(name) {
  const url = queues[name];
  const out = [];
  for (;;) {
    const r = await sqs('ReceiveMessage', {
      QueueUrl: url, MaxNumberOfMessages: 10, WaitTimeSeconds: 0, VisibilityTimeout: 30,
      MessageAttributeNames: ['All'], MessageSystemAttributeNames: ['All'], AttributeNames: ['All'],
    });
    const msgs = r.Messages || [];
    if (msgs.length === 0)
      break;
    for (const m of msgs) {
      const attrs = {};
      for (const [k, v] of Object.entries(m.MessageAttributes || {}))
        attrs[k] = v.StringValue;
      const sys = m.Attributes || {};
      out.push({ body: m.Body, attrs, group: sys.MessageGroupId || null,
        dedup: sys.MessageDeduplicationId || null, seq: sys.SequenceNumber || null });
    }
    await sqs('DeleteMessageBatch', {
      QueueUrl: url, Entries: msgs.map((m, i) => ({ Id: String(i), ReceiptHandle: m.ReceiptHandle })),
    });
  }
  return out;
}

const control = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', async () => {
    try {
      const u = new URL(req.url, 'http://x');
      const body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : {};
      let answer = {};
      if (u.pathname === '/setup') {
        Object.assign(config, body);
      } else if (u.pathname === '/queue') {
        const r = await sqs('CreateQueue', { QueueName: body.name, Attributes: body.attributes || {} });
        queues[body.name] = r.QueueUrl;
        answer = { url: `http://${frontHost}/000000000000/${body.name}` };
      } else if (u.pathname === '/delete') {
        await sqs('DeleteQueue', { QueueUrl: queues[body.name] });
        delete queues[body.name];
      } else if (u.pathname === '/fault') {
        Object.assign(faults, body);
      } else if (u.pathname === '/drain') {
        answer = await drain(u.searchParams.get('queue'));
      } else if (u.pathname === '/stats') {
        answer = stats;
      } else {
        res.writeHead(404);
        res.end();
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(answer));
    } catch (e) {
      res.writeHead(500, { 'content-type': 'text/plain' });
      res.end(String(e && e.stack || e));
    }
  });
});
await new Promise((r) => control.listen(0, '127.0.0.1', r));

const portFile = process.argv[2];
fs.writeFileSync(`${portFile}.tmp`, JSON.stringify({ sqs: front.address().port, control: control.address().port }));
fs.renameSync(`${portFile}.tmp`, portFile);
process.on('SIGTERM', () => process.exit(0));
