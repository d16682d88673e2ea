// An SQS, SNS and Kinesis endpoint for the tests: the emulators fauxqs
// (SQS, SNS) and kinesalite (Kinesis), in this process, each on a loopback port of its
// own, behind one front that checks every request's AWS Signature Version 4
// with AWS's own signer (@smithy/signature-v4), the way the services do,
// and answers as they do when it does not hold; the credential's scope
// says which service a request is for.  All from test/verify's
// node_modules.
//
//   node aws_peer.mjs PORT_FILE
//
// writes {"sqs": port, "control": port} to PORT_FILE once both listen.
// The control port (JSON in, JSON out):
//   POST /setup   {"region": r, "keys": {akid: secret, ...},
//                  "tokens": {akid: token}, "expired": [token, ...]}
//   POST /queue   {"name": n, "attributes": {...}}  -> {"url": ...}
//   POST /delete  {"name": n}                       (the queue is gone)
//   POST /purge   {"name": n}                       (the queue emptied)
//   POST /fault   {"throttle": n, "error500": n, "garbage": n, "marker": s,
//                  "marker_times": n, "marker_code": c, "marker_sender": b,
//                  "reject_marker": s}
//                  the next n requests throttled (400 ThrottlingException) or
//                  500 InternalError; entries (records) whose body (data)
//                  holds marker fail marker_times times with code c
//                  (InternalError, SenderFault false; for Kinesis
//                  InternalFailure; marker_sender: SQS says it is the
//                  sender's fault); the next n answered 200 with a body that
//                  is not JSON; a request with an entry that holds
//                  reject_marker refused whole (400 InvalidMessageContents);
//                  the next bad_ids SendMessageBatch answered 200 "stored"
//                  with Ids that are not those sent ("00", "01" ...), and not
//                  stored; the next nulls PutRecords answered with every
//                  member of a record, the absent ones null (as kinesis-mock,
//                  LocalStack's, writes them)
//   POST /stream  {"name": n, "shards": k}           a Kinesis stream
//   POST /topic   {"name": n, "attributes": {...}, "queue": q, "hidden": b}
//                  an SNS topic, its messages delivered raw to queue q
//                  (made before); -> {"arn": ...}; hidden: the front
//                  answers NotFound for it until POST /reveal {"arn": a}
//                  (so that it comes to exist with its subscription at
//                  once: SNS drops what a topic without one is sent)
//   GET  /records?stream=n  the stream's records not returned before, per
//                  shard in order: [{shard, seq, key, data}]
//   GET  /drain?queue=n   every message now in the queue, received and
//                  deleted, in order: [{body, attrs, group, dedup, seq}]
//   GET  /stats   {"requests", "verified", "refused": {reason: n},
//                  "entries", "batches": [sizes], "sts": {"requests",
//                  "issued", "refused": {code: n}}}
// STS, at POST /sts on the front's port (unsigned, as AWS's is):
// AssumeRoleWithWebIdentity with the role and web identity token of
//   POST /setup   {"web_identity": {"role": arn, "token": t}, "sts_lifetime": s}
// issues temporary credentials (an ASIA key, its secret, a session token,
// the Expiration sts_lifetime seconds on, default 3600) that the front
// then takes until they expire (ExpiredToken after); XML answers, errors
// as STS writes them (InvalidIdentityToken ...).
//   POST /expire_sessions  every session token issued so far expires now
//   POST /fault   {"sts_fail": n, "sts_status": s, "sts_code": c}  the next
//                  n AssumeRoleWithWebIdentity answered s with code c
import crypto from 'node:crypto';
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
const kinesalite = require('kinesalite');

const config = { region: 'eu-west-1', keys: {}, tokens: {}, expired: [] };
const queues = {};
const hiddenTopics = new Set();   // ARNs the front says do not exist   // name -> the URL fauxqs knows it by
const faults = { throttle: 0, error500: 0, garbage: 0, bad_ids: 0, nulls: 0, marker: null, marker_times: 0,
  marker_code: null, marker_sender: false, reject_marker: null, sts_fail: 0, sts_status: 400,
  sts_code: 'InvalidIdentityToken' };
const stats = { requests: 0, verified: 0, refused: {}, entries: 0, batches: [],
  sts: { requests: 0, issued: 0, refused: {} } };
const sessions = {};   // session token -> when it expires (ms)

const app = buildApp({ logger: false });
await app.listen({ port: 0, host: '127.0.0.1' });
const innerPort = app.server.address().port;
const kinesis = kinesalite({ createStreamMs: 0, deleteStreamMs: 0, updateStreamMs: 0, shardLimit: 1000 });
await new Promise((r) => kinesis.listen(0, '127.0.0.1', r));
const kinesisPort = kinesis.address().port;
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
    if (sessions[token] !== undefined && Date.now() >= sessions[token]) {
      refuse(res, 400, 'com.amazonaws.sqs#ExpiredToken', 'The security token included in the request is expired', 'expired session');
      return false;
    }
    if (token !== config.tokens[akid]) {
      refuse(res, 400, 'com.amazon.coral.service#UnrecognizedClientException', 'The security token included in the request is invalid.', 'wrong token');
      return false;
    }
  }
  if (region !== config.region || (service !== 'sqs' && service !== 'kinesis' && service !== 'sns')) {
    refuse(res, 403, 'com.amazonaws.sqs#SignatureDoesNotMatch', `Credential should be scoped to a valid region (${config.region}) and service`, 'scope');
    return false;
  }
  req.service = service;
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

// STS's AssumeRoleWithWebIdentity, as AWS answers it (query protocol, XML).
function sts(req, body, res) {
  const form = new URLSearchParams(body);
  const wi = config.web_identity || {};
  const fail = (status, code, message) => {
    stats.sts.refused[code] = (stats.sts.refused[code] || 0) + 1;
    res.writeHead(status, { 'content-type': 'text/xml' });
    res.end(`<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type><Code>${code}</Code><Message>${message}</Message></Error><RequestId>r${stats.sts.requests}</RequestId></ErrorResponse>`);
  };
  stats.sts.requests++;
  if (req.method !== 'POST' || req.headers.authorization !== undefined ||
      !/^application\/x-www-form-urlencoded/.test(req.headers['content-type'] || ''))
    return fail(400, 'InvalidRequest', 'not an unsigned form POST');
  if (form.get('Action') !== 'AssumeRoleWithWebIdentity' || form.get('Version') !== '2011-06-15')
    return fail(400, 'InvalidAction', 'unknown action or version');
  if (faults.sts_fail > 0) {
    faults.sts_fail--;
    return fail(faults.sts_status, faults.sts_code, 'fault injected by the test');
  }
  if (!/^[\w+=,.@-]{2,64}$/.test(form.get('RoleSessionName') || ''))
    return fail(400, 'ValidationError', 'RoleSessionName is not [\\w+=,.@-]{2,64}');
  if (form.get('RoleArn') !== wi.role)
    return fail(403, 'AccessDenied', 'Not authorized to perform sts:AssumeRoleWithWebIdentity');
  if (form.get('WebIdentityToken') !== wi.token)
    return fail(400, 'InvalidIdentityToken', 'Couldn\'t retrieve verification key from your identity provider');
  const rand = (n, set) => Array.from(crypto.randomBytes(n), (b) => set[b % set.length]).join('');
  const akid = 'ASIA' + rand(16, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567');
  const secret = rand(40, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/');
  const token = crypto.randomBytes(300).toString('base64');
  const lifetime = config.sts_lifetime || 3600;
  config.keys[akid] = secret;
  config.tokens[akid] = token;
  sessions[token] = Date.now() + lifetime * 1000;
  stats.sts.issued++;
  const expiration = new Date(sessions[token]).toISOString().replace(/\.\d{3}Z$/, 'Z');
  res.writeHead(200, { 'content-type': 'text/xml' });
  res.end(`<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleWithWebIdentityResult><SubjectFromWebIdentityToken>system:serviceaccount:default:outbox</SubjectFromWebIdentityToken><Audience>sts.amazonaws.com</Audience><AssumedRoleUser><Arn>${wi.role}/${form.get('RoleSessionName')}</Arn><AssumedRoleId>AROA:${form.get('RoleSessionName')}</AssumedRoleId></AssumedRoleUser><Credentials><SessionToken>${token}</SessionToken><SecretAccessKey>${secret}</SecretAccessKey><Expiration>${expiration}</Expiration><AccessKeyId>${akid}</AccessKeyId></Credentials><Provider>oidc.eks.example</Provider></AssumeRoleWithWebIdentityResult><ResponseMetadata><RequestId>r${stats.sts.requests}</RequestId></ResponseMetadata></AssumeRoleWithWebIdentityResponse>`);
}

// Pass a request to its emulator as it came; the answer back.
function forward(req, body, port = innerPort) {
  return new Promise((resolve, reject) => {
    const headers = { ...req.headers, 'content-length': Buffer.byteLength(body) };
    const r = http.request({ host: '127.0.0.1', port, method: req.method, path: req.url, headers }, (a) => {
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
      if (req.url === '/sts')
        return sts(req, body, res);
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
      if (faults.garbage > 0) {
        faults.garbage--;
        stats.refused.garbage = (stats.refused.garbage || 0) + 1;
        res.writeHead(200, { 'content-type': 'text/html' });
        res.end('<html>a proxy in the way</html>');
        return;
      }
      const target = req.headers['x-amz-target'];
      if (req.service === 'kinesis') {
        await kinesisRequest(req, body, res, target);
        return;
      }
      if (req.service === 'sns') {
        await snsRequest(req, body, res);
        return;
      }
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
        if (faults.bad_ids > 0) {
          faults.bad_ids--;
          stats.refused['bad ids'] = (stats.refused['bad ids'] || 0) + 1;
          res.writeHead(200, { 'content-type': 'application/x-amz-json-1.0' });
          res.end(JSON.stringify({ Successful: request.Entries.map((e) => ({ Id: `0${e.Id}`, MessageId: 'x', MD5OfMessageBody: 'x' })), Failed: [] }));
          return;
        }
        if (faults.reject_marker && request.Entries.some((e) => e.MessageBody.includes(faults.reject_marker))) {
          refuse(res, 400, 'com.amazonaws.sqs#InvalidMessageContents', 'Invalid characters found.', 'rejected whole');
          return;
        }
        if (faults.marker && faults.marker_times > 0) {
          const keep = [];
          for (const e of request.Entries) {
            if (faults.marker_times > 0 && e.MessageBody.includes(faults.marker)) {
              faults.marker_times--;
              failed.push({ Id: e.Id, SenderFault: !!faults.marker_sender, Code: faults.marker_code || 'InternalError', Message: 'injected failure of one entry' });
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

// A Kinesis request, its signature checked: PutRecords with the records
// that hold the marker failed as asked, the rest stored by kinesalite, the
// answer's records in the request's order.
async function kinesisRequest(req, body, res, target) {
  if (target !== 'Kinesis_20131202.PutRecords') {
    const a = await forward(req, body, kinesisPort);
    res.writeHead(a.status, { 'content-type': a.headers['content-type'] || 'application/x-amz-json-1.1' });
    res.end(a.body);
    return;
  }
  const request = JSON.parse(body);
  stats.entries += request.Records.length;
  stats.batches.push(request.Records.length);
  const fail = request.Records.map((r) => faults.marker && faults.marker_times > 0 &&
    Buffer.from(r.Data, 'base64').toString().includes(faults.marker) && faults.marker_times-- > 0);
  const keep = request.Records.filter((r, i) => !fail[i]);
  let stored = [];
  if (keep.length > 0) {
    const a = await forward(req, JSON.stringify({ ...request, Records: keep }), kinesisPort);
    if (a.status !== 200) {
      res.writeHead(a.status, { 'content-type': 'application/x-amz-json-1.1' });
      res.end(a.body);
      return;
    }
    stored = JSON.parse(a.body).Records;
  }
  let k = 0;
  let records = request.Records.map((r, i) => fail[i]
    ? { ErrorCode: faults.marker_code || 'InternalFailure', ErrorMessage: 'injected failure of one record' }
    : stored[k++]);
  if (faults.nulls > 0) {
    faults.nulls--;
    stats.refused.nulls = (stats.refused.nulls || 0) + 1;
    records = records.map((r) => ({ EncryptionType: null, ErrorCode: null, ErrorMessage: null,
      SequenceNumber: null, ShardId: null, ...r }));
  }
  res.writeHead(200, { 'content-type': 'application/x-amz-json-1.1' });
  res.end(JSON.stringify({ FailedRecordCount: records.filter((r) => r.ErrorCode).length, Records: records }));
}

// An SNS request, its signature checked: PublishBatch with the faults
// asked for (the entries that hold the marker failed, the others renumbered
// and published by fauxqs; a request with reject_marker refused whole).
async function snsRequest(req, body, res) {
  const form = new URLSearchParams(body);
  if (hiddenTopics.has(form.get('TopicArn'))) {
    res.writeHead(404, { 'content-type': 'text/xml' });
    res.end('<ErrorResponse><Error><Type>Sender</Type><Code>NotFound</Code>'
      + '<Message>Topic does not exist</Message></Error></ErrorResponse>');
    return;
  }
  let failed = '';
  if (form.get('Action') === 'PublishBatch') {
    const entry = /^PublishBatchRequestEntries\.member\.(\d+)\.(.*)$/;
    const members = [...new Set([...form.keys()].map((k) => entry.exec(k)).filter(Boolean).map((m) => +m[1]))]
      .sort((x, y) => x - y);
    const message = (i) => form.get(`PublishBatchRequestEntries.member.${i}.Message`) || '';
    stats.entries += members.length;
    stats.batches.push(members.length);
    if (faults.reject_marker && members.some((i) => message(i).includes(faults.reject_marker))) {
      stats.refused['rejected whole'] = (stats.refused['rejected whole'] || 0) + 1;
      res.writeHead(400, { 'content-type': 'text/xml' });
      res.end('<ErrorResponse><Error><Type>Sender</Type><Code>InvalidParameter</Code>'
        + '<Message>Invalid parameter: Message</Message></Error></ErrorResponse>');
      return;
    }
    const keep = [];
    for (const i of members) {
      if (faults.marker && faults.marker_times > 0 && message(i).includes(faults.marker)) {
        faults.marker_times--;
        failed += `<member><Id>${form.get(`PublishBatchRequestEntries.member.${i}.Id`)}</Id>`
          + `<Code>${faults.marker_code || 'InternalError'}</Code><Message>injected failure of one entry</Message>`
          + `<SenderFault>${faults.marker_sender ? 'true' : 'false'}</SenderFault></member>`;
      } else {
        keep.push(i);
      }
    }
    if (failed) {
      if (keep.length === 0) {
        res.writeHead(200, { 'content-type': 'text/xml' });
        res.end(`<PublishBatchResponse><PublishBatchResult><Successful></Successful><Failed>${failed}</Failed></PublishBatchResult></PublishBatchResponse>`);
        return;
      }
      const out = new URLSearchParams();
      for (const [k, v] of form) {
        const m = entry.exec(k);
        if (!m)
          out.append(k, v);
        else if (keep.includes(+m[1]))
          out.append(`PublishBatchRequestEntries.member.${keep.indexOf(+m[1]) + 1}.${m[2]}`, v);
      }
      body = out.toString();
    }
  }
  const a = await forward(req, body);
  res.writeHead(a.status, { 'content-type': a.headers['content-type'] || 'text/xml' });
  res.end(failed && a.status === 200 ? a.body.replace('<Failed>', `<Failed>${failed}`) : a.body);
}

// A Kinesis call of the control port's (kinesalite wants an Authorization
// header; it checks no signature).
async function kinesisCall(action, params) {
  const body = JSON.stringify(params);
  const a = await forward({
    method: 'POST', url: '/',
    headers: {
      host: `127.0.0.1:${kinesisPort}`, 'content-type': 'application/x-amz-json-1.1',
      'x-amz-target': `Kinesis_20131202.${action}`, 'x-amz-date': '20200101T000000Z',
      authorization: 'AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20200101/eu-west-1/kinesis/aws4_request, SignedHeaders=host, Signature=0',
    },
  }, body, kinesisPort);
  if (a.status !== 200)
    throw new Error(`${action}: ${a.status} ${a.body}`);
  return a.body ? JSON.parse(a.body) : {};
}

const readFrom = {};   // stream -> shard -> the last sequence number returned
async function kinesisRecords(stream) {
  const d = await kinesisCall('DescribeStream', { StreamName: stream });
  const out = [];
  readFrom[stream] = readFrom[stream] || {};
  for (const shard of d.StreamDescription.Shards) {
    const after = readFrom[stream][shard.ShardId];
    let it = (await kinesisCall('GetShardIterator', after
      ? { StreamName: stream, ShardId: shard.ShardId, ShardIteratorType: 'AFTER_SEQUENCE_NUMBER', StartingSequenceNumber: after }
      : { StreamName: stream, ShardId: shard.ShardId, ShardIteratorType: 'TRIM_HORIZON' })).ShardIterator;
    for (;;) {
      const r = await kinesisCall('GetRecords', { ShardIterator: it, Limit: 10000 });
      for (const rec of r.Records) {
        out.push({ shard: shard.ShardId, seq: rec.SequenceNumber, key: rec.PartitionKey,
          data: Buffer.from(rec.Data, 'base64').toString() });
        readFrom[stream][shard.ShardId] = rec.SequenceNumber;
      }
      if (r.Records.length === 0 || !r.NextShardIterator)
        break;
      it = r.NextShardIterator;
    }
  }
  return out;
}
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

// An SNS call of the control port's: a form, an XML answer (fauxqs takes
// the region from the Authorization header's scope; it checks no signature).
async function sns(params) {
  const r = await app.inject({
    method: 'POST', url: '/',
    headers: {
      host: frontHost, 'content-type': 'application/x-www-form-urlencoded',
      authorization: `AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20200101/${config.region}/sns/aws4_request, SignedHeaders=host, Signature=0`,
    },
    payload: new URLSearchParams(params).toString(),
  });
  if (r.statusCode !== 200)
    throw new Error(`${params.Action}: ${r.statusCode} ${r.body}`);
  return r.body;
}

async function snsTopic(name, attributes, queue) {
  const params = { Action: 'CreateTopic', Name: name };
  Object.entries(attributes).forEach(([k, v], i) => {
    params[`Attributes.entry.${i + 1}.key`] = k;
    params[`Attributes.entry.${i + 1}.value`] = v;
  });
  const arn = /<TopicArn>([^<]+)<\/TopicArn>/.exec(await sns(params))[1];
  const q = await sqs('GetQueueAttributes', { QueueUrl: queues[queue], AttributeNames: ['QueueArn'] });
  await sns({ Action: 'Subscribe', TopicArn: arn, Protocol: 'sqs', Endpoint: q.Attributes.QueueArn,
    'Attributes.entry.1.key': 'RawMessageDelivery', 'Attributes.entry.1.value': 'true' });
  return arn;
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
      } else if (u.pathname === '/topic') {
        answer = { arn: await snsTopic(body.name, body.attributes || {}, body.queue) };
        if (body.hidden)
          hiddenTopics.add(answer.arn);
      } else if (u.pathname === '/reveal') {
        hiddenTopics.delete(body.arn);
      } else if (u.pathname === '/purge') {
        await sqs('PurgeQueue', { QueueUrl: queues[body.name] });
      } else if (u.pathname === '/delete') {
        await sqs('DeleteQueue', { QueueUrl: queues[body.name] });
        delete queues[body.name];
      } else if (u.pathname === '/fault') {
        Object.assign(faults, body);
      } else if (u.pathname === '/expire_sessions') {
        for (const t of Object.keys(sessions))
          sessions[t] = 0;
      } else if (u.pathname === '/drain') {
        answer = await drain(u.searchParams.get('queue'));
      } else if (u.pathname === '/stream') {
        await kinesisCall('CreateStream', { StreamName: body.name, ShardCount: body.shards || 1 });
      } else if (u.pathname === '/records') {
        answer = await kinesisRecords(u.searchParams.get('stream'));
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
