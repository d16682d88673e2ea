-- OAuth2 client credentials of HTTP targets: outbox.set_oauth2() and its
-- checks (delivery with tokens against a real token endpoint is in
-- test/t/081_oauth2.pl).  No value of a secret appears in an error.
SELECT outbox.create_http_target('hook', 'http://127.0.0.1:9/hook');
SELECT outbox.set_oauth2('hook', 'http://127.0.0.1:8/token', 'relay', 's3cret-value', 'hooks.write');
SELECT name, oauth_token_url, oauth_client_id, oauth_scope, oauth_client_auth
  FROM outbox.targets WHERE name = 'hook';
-- another client authentication; no scope
SELECT outbox.set_oauth2('hook', 'http://127.0.0.1:8/token', 'relay', 's3cret-value', client_auth => 'post');
SELECT oauth_scope, oauth_client_auth FROM outbox.targets WHERE name = 'hook';
-- token URLs
SELECT outbox.set_oauth2('hook', 'http://idp.example.com/token', 'relay', 's3cret-value');
SELECT outbox.set_oauth2('hook', 'ftp://127.0.0.1/token', 'relay', 's3cret-value');
-- (a query is kept: the URL is not secret)
SELECT outbox.set_oauth2('hook', 'https://127.0.0.1:8/token?tenant=1', 'relay', 's3cret-value');
SELECT oauth_token_url FROM outbox.targets WHERE name = 'hook';
SELECT outbox.set_oauth2('hook', 'https://idp.example.com/tok en', 'relay', 's3cret-value');
-- client id, secret, scope, client_auth
SELECT outbox.set_oauth2('hook', 'http://127.0.0.1:8/token', NULL, 's3cret-value');
SELECT outbox.set_oauth2('hook', 'http://127.0.0.1:8/token', E're\nlay', 's3cret-value');
SELECT outbox.set_oauth2('hook', 'http://127.0.0.1:8/token', 'relay', E's3cret-value\r\nX-Evil: 1');
SELECT outbox.set_oauth2('hook', 'http://127.0.0.1:8/token', 'relay', NULL);
SELECT outbox.set_oauth2('hook', 'http://127.0.0.1:8/token', 'relay', 's3cret-value', 'a  b');
SELECT outbox.set_oauth2('hook', 'http://127.0.0.1:8/token', 'relay', 's3cret-value', 'a"b');
SELECT outbox.set_oauth2('hook', 'http://127.0.0.1:8/token', 'relay', 's3cret-value', client_auth => 'jwt');
-- the relay's Authorization header is the only one
SELECT outbox.alter_target('hook', headers => '{"Authorization": "Bearer static"}');
SELECT outbox.alter_target('hook', headers => '{"authorization_": "x", "x-tenant": "t1"}');
SELECT outbox.alter_target('hook', headers => '{"x-tenant": "t1"}');
-- the token goes to https:// receivers (or loopback ones) only
SELECT outbox.alter_target('hook', url => 'http://192.0.2.1/hook');
-- only HTTP targets
SELECT outbox.create_notify_target('nt', 'outbox_oauth');
SELECT outbox.set_oauth2('nt', 'http://127.0.0.1:8/token', 'relay', 's3cret-value');
SELECT outbox.set_oauth2('nope', 'http://127.0.0.1:8/token', 'relay', 's3cret-value');
-- taken away
SELECT outbox.set_oauth2('hook', NULL, 'relay');
SELECT outbox.set_oauth2('hook', NULL);
SELECT oauth_token_url, oauth_client_id, oauth_client_secret, oauth_scope, oauth_client_auth
  FROM outbox.targets WHERE name = 'hook';
-- the table's own checks (a row written by hand)
\set VERBOSITY terse
UPDATE outbox.targets SET oauth_token_url = 'http://127.0.0.1:8/token' WHERE name = 'hook';
UPDATE outbox.targets SET oauth_token_url = 'http://127.0.0.1:8/token', oauth_client_id = 'relay',
       oauth_client_secret = 's', oauth_client_auth = 'digest' WHERE name = 'hook';
UPDATE outbox.targets SET oauth_token_url = 'http://127.0.0.1:8/token', oauth_client_id = 'relay',
       oauth_client_secret = 's', oauth_client_auth = 'basic' WHERE name = 'nt';
\set VERBOSITY default
SELECT has_function_privilege('public', 'outbox.set_oauth2(text, text, text, text, text, text)', 'EXECUTE');
SELECT outbox.drop_target('hook');
SELECT outbox.drop_target('nt');
