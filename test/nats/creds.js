// Operator-mode NATS identities for the tests, made with @nats-io/jwt
// (test/verify's node_modules): node creds.js DIR writes into DIR
//   operator.jwt               the operator (system account SYS)
//   resolver.conf              the accounts' JWTs, for resolver_preload
//   relay.creds                a user of account APP (JetStream allowed)
//   revoked.creds              a user of APP that APP's JWT revokes
//   stranger.creds             a user of an account the server does not know
//   expired.creds              a user of APP whose JWT has expired
// and prints APP's public key.
'use strict';
const path = require('path');
const fs = require('fs');
const jwt = require(path.join(__dirname, '..', 'verify', 'node_modules', '@nats-io', 'jwt'));

async function main() {
  const dir = process.argv[2];
  if (!dir || !fs.statSync(dir).isDirectory()) {
    throw new Error('usage: node creds.js DIR (an existing directory)');
  }
  const op = jwt.createOperator();
  const sys = jwt.createAccount();
  const app = jwt.createAccount();
  const unknown = jwt.createAccount();
  const users = { relay: jwt.createUser(), revoked: jwt.createUser(),
    stranger: jwt.createUser(), expired: jwt.createUser() };
  const now = Math.floor(Date.now() / 1000);

  const operator = await jwt.encodeOperator('outbox-test', op, { system_account: sys.getPublicKey() });
  const sysJwt = await jwt.encodeAccount('SYS', sys, {}, { signer: op });
  const appJwt = await jwt.encodeAccount('APP', app, {
    limits: { mem_storage: -1, disk_storage: -1, streams: -1, consumer: -1,
      subs: -1, data: -1, payload: -1, imports: -1, exports: -1, wildcards: true, conn: -1, leaf: -1 },
    // (a user's JWTs issued before this time are revoked: all of them)
    revocations: { [users.revoked.getPublicKey()]: now + 86400 },
  }, { signer: op });
  fs.writeFileSync(path.join(dir, 'operator.jwt'), operator + '\n');
  fs.writeFileSync(path.join(dir, 'resolver.conf'),
    `system_account: ${sys.getPublicKey()}\nresolver: MEMORY\nresolver_preload: {\n` +
    `  ${sys.getPublicKey()}: ${sysJwt}\n  ${app.getPublicKey()}: ${appJwt}\n}\n`);
  for (const [name, kp] of Object.entries(users)) {
    const issuer = name === 'stranger' ? unknown : app;
    const opts = name === 'expired' ? { exp: now - 3600 } : {};
    const token = await jwt.encodeUser(name, kp, issuer, {}, opts);
    fs.writeFileSync(path.join(dir, `${name}.creds`), jwt.fmtCreds(token, kp), { mode: 0o644 });
  }
  process.stdout.write(app.getPublicKey() + '\n');
}

main().catch((e) => { process.stderr.write(String(e.stack || e) + '\n'); process.exit(1); });
