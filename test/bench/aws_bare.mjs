// aws_bare.mjs - the bare client of aws_bench.sh: the same signed requests
// the relay sends (SQS SendMessageBatch, SNS PublishBatch or Kinesis
// PutRecords), with the
// same batching, from LANES concurrent workers over keep-alive connections,
// signed with AWS's own signer (@smithy/signature-v4, test/verify's
// node_modules).  Prints one JSON line: {"n", "requests", "seconds",
// "rate", "sign_us"} (sign_us: the signer's own time per request).
//
//   node aws_bare.mjs sqs|sns|kinesis ENDPOINT QUEUE_URL|TOPIC_ARN|STREAM REGION KEY_ID SECRET N KEYS BATCH LANES
//
// Message n (1..N) has key k<n % KEYS> and body {"key": "k..", "seq": n,
// "data": "xxxxxxxx"}; a worker (lane) takes the keys whose number is its
// index modulo LANES, and sends its messages in order, BATCH at a time, at
// most one of a key a request, as the relay's lanes do.  SQS entries carry
// the attributes the relay gives (outbox-id, outbox-seq, outbox-topic,
// outbox-key); a Kinesis record's data is an envelope of the same shape.
import http from 'node:http';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '..', 'verify', 'node_modules', 'x.js'));
const { SignatureV4 } = require('@smithy/signature-v4');
const { Hash } = require('@smithy/hash-node');

const [service, endpoint, target, region, keyId, secret, nArg, keysArg, batchArg, lanesArg] = process.argv.slice(2);
const N = +nArg, KEYS = +keysArg, BATCH = +batchArg, LANES = +lanesArg;
const url = new URL(endpoint);
const agent = new http.Agent({ keepAlive: true, maxSockets: LANES });
const signer = new SignatureV4({
  credentials: { accessKeyId: keyId, secretAccessKey: secret }, region, service,
  sha256: Hash.bind(null, 'sha256'), uriEscapePath: true, applyChecksum: false,
});
let signNs = 0n;
let requests = 0;

function entry(n, pos) {
  const key = `k${n % KEYS}`;
  const body = JSON.stringify({ key, seq: n, data: 'xxxxxxxx' });
  const id = randomUUID();
  if (service === 'sqs' || service === 'sns') {
    return {
      Id: String(pos), MessageBody: body,
      MessageAttributes: {
        'outbox-id': { DataType: 'String', StringValue: id },
        'outbox-seq': { DataType: 'Number', StringValue: String(n) },
        'outbox-topic': { DataType: 'String', StringValue: 'bench' },
        'outbox-key': { DataType: 'String', StringValue: key },
      },
    };
  }
  const env = JSON.stringify({ id, seq: n, topic: 'bench', key, headers: {}, payload: JSON.parse(body),
    emitted_at: new Date().toISOString() });
  return { Data: Buffer.from(env).toString('base64'), PartitionKey: key };
}

// An SNS PublishBatch form of the entries.
function snsForm(entries) {
  const form = new URLSearchParams({ Action: 'PublishBatch', Version: '2010-03-31', TopicArn: target });
  entries.forEach((e, i) => {
    const p = `PublishBatchRequestEntries.member.${i + 1}`;
    form.append(`${p}.Id`, e.Id);
    form.append(`${p}.Message`, e.MessageBody);
    Object.entries(e.MessageAttributes).forEach(([name, v], k) => {
      form.append(`${p}.MessageAttributes.entry.${k + 1}.Name`, name);
      form.append(`${p}.MessageAttributes.entry.${k + 1}.Value.DataType`, v.DataType);
      form.append(`${p}.MessageAttributes.entry.${k + 1}.Value.StringValue`, v.StringValue);
    });
  });
  return form.toString();
}

async function send(ns) {
  const body = service === 'sns' ? snsForm(ns.map((n, i) => entry(n, i))) : JSON.stringify(service === 'sqs'
    ? { QueueUrl: target, Entries: ns.map((n, i) => entry(n, i)) }
    : { StreamName: target, Records: ns.map((n, i) => entry(n, i)) });
  const headers = service === 'sns'
    ? { host: url.host, 'content-type': 'application/x-www-form-urlencoded; charset=utf-8' }
    : {
      host: url.host,
      'content-type': service === 'sqs' ? 'application/x-amz-json-1.0' : 'application/x-amz-json-1.1',
      'x-amz-target': service === 'sqs' ? 'AmazonSQS.SendMessageBatch' : 'Kinesis_20131202.PutRecords',
    };
  const t0 = process.hrtime.bigint();
  const signed = await signer.sign({ method: 'POST', protocol: 'http:', hostname: url.hostname,
    port: +url.port, path: '/', query: {}, headers, body });
  signNs += process.hrtime.bigint() - t0;
  requests++;
  await new Promise((resolve, reject) => {
    const r = http.request({ host: url.hostname, port: url.port, method: 'POST', path: '/', agent,
      headers: { ...signed.headers, 'content-length': Buffer.byteLength(body) } }, (a) => {
      const chunks = [];
      a.on('data', (c) => chunks.push(c));
      a.on('end', () => {
        const answer = Buffer.concat(chunks).toString();
        if (a.statusCode !== 200)
          return reject(new Error(`${a.statusCode} ${answer}`));
        if (service === 'sns')
          return /<Failed>\s*<member>/.test(answer) ? reject(new Error(`failed entries: ${answer.slice(0, 300)}`)) : resolve();
        const j = JSON.parse(answer);
        if ((j.Failed && j.Failed.length) || j.FailedRecordCount)
          return reject(new Error(`failed entries: ${answer.slice(0, 300)}`));
        resolve();
      });
    });
    r.on('error', reject);
    r.end(body);
  });
}

async function lane(index) {
  // this lane's messages, in order; requests of at most BATCH, one of a key
  const mine = [];
  for (let n = 1; n <= N; n++)
    if ((n % KEYS) % LANES === index)
      mine.push(n);
  let i = 0;
  while (i < mine.length) {
    const batch = [];
    const keys = new Set();
    while (i < mine.length && batch.length < BATCH && !keys.has(mine[i] % KEYS)) {
      keys.add(mine[i] % KEYS);
      batch.push(mine[i++]);
    }
    await send(batch);
  }
}

const start = process.hrtime.bigint();
await Promise.all(Array.from({ length: LANES }, (_, i) => lane(i)));
const seconds = Number(process.hrtime.bigint() - start) / 1e9;
console.log(JSON.stringify({ n: N, requests, seconds, rate: N / seconds,
  sign_us: Number(signNs) / 1000 / requests }));
agent.destroy();
