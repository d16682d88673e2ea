// An OAuth2 token endpoint and a webhook receiver that takes only its
// tokens, for the tests of OAuth2 client credentials (test/t/081_oauth2.pl):
// the token endpoint is the npm package oauth2-mock-server (RS256 JWTs,
// RFC 6749 client_credentials), with the client's id and secret checked
// here; the receiver verifies each request's "Authorization: Bearer" JWT
// with the issuer's keys (jose, the package oauth2-mock-server signs with),
// its expiry and scope, and answers 401 otherwise.  All from test/verify's
// node_modules, on loopback.
//
//   node oauth_peer.mjs PORT_FILE
//
// writes {"token": port, "receiver": port, "control": port} to PORT_FILE:
// the token endpoint is http://127.0.0.2:port/token (another loopback
// address than the receiver's, so that the destination rules can refuse
// it alone), the receiver http://127.0.0.1:port/.
// The control port (JSON in, JSON out):
//   POST /setup  {"clients": {id: secret}, "method": "basic"|"post",
//                 "scope": s}   the client credentials taken, how, and the
//                 scope every token must hold (null: any)
//   POST /fault  {"token_status": n, "token_body": s, "token_times": k,
//                 "expires_in": s, "receiver_401": k, "down": b}
//                 the next token_times token requests answered status n
//                 with body s (as is, so not JSON when it is not); the
//                 lifetime of the tokens issued from now on; the next
//                 receiver_401 webhook requests answered 401 whatever their
//                 token (a token the receiver no longer takes); down: the
//                 token endpoint stops listening (false: it listens again,
//                 on the same port)
//   GET  /messages  every webhook request taken, in order: [{body, jti, iat}]
//   GET  /stats  {"token_requests", "tokens", "methods": [...], "scopes":
//                 [...], "refused": {reason: n}, "taken"}
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const modules = path.join(here, '..', 'verify', 'node_modules');
const { OAuth2Server } = await import(pathToFileURL(path.join(modules, 'oauth2-mock-server', 'dist', 'index.mjs')));
const jose = await import(pathToFileURL(path.join(modules, 'jose', 'dist', 'webapi', 'index.js')));

const portFile = process.argv[2];
let clients = {};
let method = 'basic';
let wantScope = null;
let fault = { token_status: 0, token_body: '', token_times: 0, expires_in: 3600, receiver_401: 0 };
const stats = { token_requests: 0, tokens: 0, methods: [], scopes: [], refused: {}, taken: 0 };
const messages = [];

const server = new OAuth2Server();
await server.issuer.keys.generate('RS256');
await server.start(0, '127.0.0.1');
const jwks = jose.createLocalJWKSet({ keys: server.issuer.keys.toJSON() });

// The token endpoint the relay is given: a front that answers a fault
// itself (its body as it is, JSON or not) and passes the rest on to
// oauth2-mock-server; "down" closes its listener.
const front = http.createServer((req, res) => {
	const chunks = [];
	req.on('data', (c) => chunks.push(c));
	req.on('end', () => {
		stats.token_requests++;
		if (fault.token_times > 0) {
			fault.token_times--;
			res.writeHead(fault.token_status, { 'content-type': 'application/json' });
			res.end(fault.token_body);
			return;
		}
		const inner = http.request({
			host: '127.0.0.1', port: server.address().port, method: req.method, path: req.url,
			headers: req.headers,
		}, (ires) => {
			res.writeHead(ires.statusCode, ires.headers);
			ires.pipe(res);
		});
		inner.on('error', (e) => { res.writeHead(502); res.end(String(e)); });
		inner.end(Buffer.concat(chunks));
	});
});
await new Promise((resolve) => front.listen(0, '127.0.0.2', resolve));
const tokenPort = front.address().port;

function refuse(reason) {
	stats.refused[reason] = (stats.refused[reason] || 0) + 1;
}

server.service.on('beforeTokenSigning', (token) => {
	token.payload.exp = token.payload.iat + fault.expires_in;
	token.payload.jti = `t${stats.tokens + 1}`;
});
server.service.on('beforeResponse', (resp, req) => {
	const body = req.body || {};
	let id;
	let secret;
	const auth = req.headers.authorization || '';
	if (auth.startsWith('Basic ')) {
		const pair = Buffer.from(auth.slice(6), 'base64').toString('utf8');
		const colon = pair.indexOf(':');
		id = decodeURIComponent(pair.slice(0, colon).replace(/\+/g, ' '));
		secret = decodeURIComponent(pair.slice(colon + 1).replace(/\+/g, ' '));
		stats.methods.push('basic');
	} else {
		id = body.client_id;
		secret = body.client_secret;
		stats.methods.push('post');
	}
	stats.scopes.push(body.scope ?? null);
	if (stats.methods[stats.methods.length - 1] !== method || clients[id] === undefined ||
		clients[id] !== secret || body.grant_type !== 'client_credentials') {
		refuse('client');
		resp.statusCode = 401;
		resp.body = { error: 'invalid_client', error_description: 'client authentication failed' };
		return;
	}
	resp.body.expires_in = fault.expires_in;
	stats.tokens++;
});

// The receiver: a JSON body, an Authorization: Bearer token of this issuer.
const receiver = http.createServer((req, res) => {
	const chunks = [];
	req.on('data', (c) => chunks.push(c));
	req.on('end', async () => {
		const body = Buffer.concat(chunks).toString('utf8');
		const auth = req.headers.authorization || '';
		const no = (reason) => {
			refuse(reason);
			res.writeHead(401, { 'www-authenticate': `Bearer error="invalid_token", error_description="${reason}"` });
			res.end(reason);
		};
		if (!auth.startsWith('Bearer '))
			return no('no bearer token');
		if (req.rawHeaders.filter((h, i) => i % 2 === 0 && h.toLowerCase() === 'authorization').length !== 1)
			return no('several Authorization headers');
		let claims;
		try {
			({ payload: claims } = await jose.jwtVerify(auth.slice(7), jwks, { issuer: server.issuer.url }));
		} catch (e) {
			return no(`token refused: ${e.code || e.message}`);
		}
		if (wantScope !== null && claims.scope !== wantScope)
			return no('wrong scope');
		if (fault.receiver_401 > 0) {
			fault.receiver_401--;
			return no('token revoked');
		}
		stats.taken++;
		messages.push({ body, jti: claims.jti, iat: claims.iat });
		res.writeHead(200);
		res.end();
	});
});
await new Promise((resolve) => receiver.listen(0, '127.0.0.1', resolve));

function json(res, status, v) {
	res.writeHead(status, { 'content-type': 'application/json' });
	res.end(JSON.stringify(v));
}

const control = http.createServer((req, res) => {
	const chunks = [];
	req.on('data', (c) => chunks.push(c));
	req.on('end', async () => {
		try {
			const body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString('utf8')) : {};
			const url = new URL(req.url, 'http://x');
			if (url.pathname === '/setup') {
				clients = body.clients || {};
				method = body.method || 'basic';
				wantScope = body.scope ?? null;
				return json(res, 200, { ok: true });
			}
			if (url.pathname === '/fault') {
				if (body.down === true) {
					front.close();
					front.closeAllConnections();
				} else if (body.down === false)
					await new Promise((resolve) => front.listen(tokenPort, '127.0.0.2', resolve));
				for (const k of ['token_status', 'token_body', 'token_times', 'expires_in', 'receiver_401'])
					if (body[k] !== undefined)
						fault[k] = body[k];
				return json(res, 200, { ok: true });
			}
			if (url.pathname === '/messages')
				return json(res, 200, messages);
			if (url.pathname === '/stats')
				return json(res, 200, stats);
			json(res, 404, { error: 'no such control' });
		} catch (e) {
			json(res, 500, { error: String(e && e.stack || e) });
		}
	});
});
await new Promise((resolve) => control.listen(0, '127.0.0.1', resolve));

fs.writeFileSync(portFile + '.tmp', JSON.stringify({
	token: tokenPort, receiver: receiver.address().port, control: control.address().port,
}));
fs.renameSync(portFile + '.tmp', portFile);
