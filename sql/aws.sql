-- Amazon SQS and Kinesis targets: their options, as the create functions,
-- alter_target and set_aws_credentials check them (delivery against the
-- emulators is in test/t/078_sqs.pl and 079_kinesis.pl).
SELECT outbox.create_sqs_target('sq', 'http://127.0.0.1:4566/123456789012/orders.fifo', 'eu-west-1',
                                'AKIAIOSFODNN7EXAMPLE', 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY');
SELECT outbox.create_kinesis_target('kn', 'orders', 'eu-west-1', 'AKIAIOSFODNN7EXAMPLE',
                                    'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY', endpoint => 'http://127.0.0.1:4567');
SELECT name, kind, url, stream, region, aws_access_key_id, aws_session_token, batch_size, lanes
  FROM outbox.targets WHERE kind IN ('sqs', 'kinesis') ORDER BY name;
-- queue URLs
SELECT outbox.create_sqs_target('x', 'http://127.0.0.1:4566/orders', 'eu-west-1', 'AKIAIOSFODNN7EXAMPLE', 's');
SELECT outbox.create_sqs_target('x', 'http://127.0.0.1:4566/123456789012/or%20ders', 'eu-west-1', 'AKIAIOSFODNN7EXAMPLE', 's');
SELECT outbox.create_sqs_target('x', 'ftp://127.0.0.1/123456789012/orders', 'eu-west-1', 'AKIAIOSFODNN7EXAMPLE', 's');
SELECT outbox.create_sqs_target('x', 'http://127.0.0.1:4566/123456789012/orders?x=1', 'eu-west-1', 'AKIAIOSFODNN7EXAMPLE', 's');
-- regions
SELECT outbox.create_sqs_target('x', 'https://sqs.us-east-1.amazonaws.com/123456789012/orders', 'eu-west-1', 'AKIAIOSFODNN7EXAMPLE', 's');
SELECT outbox.create_sqs_target('x', 'http://127.0.0.1:4566/123456789012/orders', 'EU West', 'AKIAIOSFODNN7EXAMPLE', 's');
SELECT outbox.create_kinesis_target('x', 'orders', 'eu-west-1', 'AKIAIOSFODNN7EXAMPLE', 's', endpoint => 'https://kinesis.us-east-1.amazonaws.com');
-- credentials: the error shows none of their values
SELECT outbox.create_sqs_target('x', 'http://127.0.0.1:4566/123456789012/orders', 'eu-west-1', 'AKIA', 's');
SELECT outbox.create_sqs_target('x', 'http://127.0.0.1:4566/123456789012/orders', 'eu-west-1', 'AKIAIOSFODNN7EXAMPLE', 'a secret');
SELECT outbox.create_sqs_target('x', 'http://127.0.0.1:4566/123456789012/orders', 'eu-west-1', 'AKIAIOSFODNN7EXAMPLE', 's', E'tok\r\nX-Evil: 1');
SELECT outbox.create_sqs_target('x', 'http://127.0.0.1:4566/123456789012/orders', 'eu-west-1', NULL, 's');
-- batches, formats, streams
SELECT outbox.create_sqs_target('x', 'http://127.0.0.1:4566/123456789012/orders', 'eu-west-1', 'AKIAIOSFODNN7EXAMPLE', 's', batch_size => 11);
SELECT outbox.create_sqs_target('x', 'http://127.0.0.1:4566/123456789012/orders', 'eu-west-1', 'AKIAIOSFODNN7EXAMPLE', 's', format => 'cloudevents');
SELECT outbox.create_kinesis_target('x', 'or/ders', 'eu-west-1', 'AKIAIOSFODNN7EXAMPLE', 's', endpoint => 'http://127.0.0.1:4567');
SELECT outbox.create_kinesis_target('x', 'orders', 'eu-west-1', 'AKIAIOSFODNN7EXAMPLE', 's', endpoint => 'http://127.0.0.1:4567/path');
SELECT outbox.create_kinesis_target('x', 'orders', 'eu-west-1', 'AKIAIOSFODNN7EXAMPLE', 's', endpoint => 'http://127.0.0.1:4567', batch_size => 501);
-- SNS topics
SELECT outbox.create_sns_target('sn', 'arn:aws:sns:eu-west-1:123456789012:orders.fifo', 'AKIAIOSFODNN7EXAMPLE', 's', endpoint => 'http://127.0.0.1:4566');
SELECT outbox.create_sns_target('x', 'arn:aws:sqs:eu-west-1:123456789012:orders', 'AKIAIOSFODNN7EXAMPLE', 's');
SELECT outbox.create_sns_target('x', 'arn:aws:sns:eu-west-1:12345:orders', 'AKIAIOSFODNN7EXAMPLE', 's');
SELECT outbox.create_sns_target('x', 'arn:aws:sns:eu-west-1:123456789012:orders', 'AKIAIOSFODNN7EXAMPLE', 's', endpoint => 'https://sns.us-east-1.amazonaws.com');
SELECT outbox.create_sns_target('x', 'arn:aws:sns:eu-west-1:123456789012:orders', 'AKIAIOSFODNN7EXAMPLE', 's', endpoint => 'http://10.0.0.1');
SELECT outbox.alter_target('sn', topic => 'arn:aws:sns:eu-west-1:123456789012:other', batch_size => 5);
SELECT outbox.alter_target('sn', properties => '{}');
SELECT name, url, topic, region, batch_size FROM outbox.targets WHERE kind = 'sns';
SELECT outbox.drop_target('sn');
-- alter_target and set_aws_credentials
SELECT outbox.alter_target('sq', batch_size => 5, lanes => 4);
SELECT outbox.alter_target('kn', stream => 'orders2', batch_size => 500);
SELECT outbox.alter_target('sq', stream => 'x');
SELECT outbox.alter_target('sq', headers => '{"a": "b"}');
SELECT outbox.alter_target('kn', maxlen => 5);
SELECT outbox.alter_target('sq', url => 'https://sqs.us-east-1.amazonaws.com/123456789012/orders');
SELECT outbox.set_aws_credentials('sq', 'ASIAIOSFODNN7EXAMPLE', 'secret2', 'token');
SELECT outbox.set_aws_credentials('kn', 'AKIAIOSFODNN7EXAMPLE', 'secret 3');
SELECT outbox.create_http_target('web', 'http://127.0.0.1:9/hook');
SELECT outbox.set_aws_credentials('web', 'AKIAIOSFODNN7EXAMPLE', 'secret');
SELECT outbox.set_aws_credentials('nope', 'AKIAIOSFODNN7EXAMPLE', 'secret');
SELECT name, batch_size, lanes, pending_lanes, stream, aws_access_key_id, aws_session_token FROM outbox.targets WHERE kind IN ('sqs', 'kinesis') ORDER BY name;
-- web identity instead of an access key (STS AssumeRoleWithWebIdentity)
SELECT outbox.set_aws_web_identity('sq', 'arn:aws:iam::123456789012:role/outbox-relay', current_setting('data_directory') || '/PG_VERSION');
SELECT name, aws_access_key_id, aws_secret_access_key, aws_role_arn,
       aws_web_identity_token_file LIKE '%/PG_VERSION' AS token_file, aws_sts_endpoint
  FROM outbox.targets WHERE name = 'sq';
SELECT outbox.set_aws_web_identity('sq', 'arn:aws:iam::123456789012:user/bob', current_setting('data_directory') || '/PG_VERSION');
SELECT outbox.set_aws_web_identity('sq', 'arn:aws:iam::123456789012:role/outbox-relay', 'relative/token');
SELECT outbox.set_aws_web_identity('sq', 'arn:aws:iam::123456789012:role/outbox-relay', '/nonexistent/token');
SELECT outbox.set_aws_web_identity('sq', 'arn:aws:iam::123456789012:role/outbox-relay', current_setting('data_directory') || '/PG_VERSION', 'http://sts.example.com/');
SELECT outbox.set_aws_web_identity('sq', NULL, NULL);
SELECT outbox.set_aws_web_identity('web', 'arn:aws:iam::123456789012:role/outbox-relay', '/x');
SELECT outbox.create_kinesis_target('kw', 'orders', 'eu-west-1', role_arn => 'arn:aws:iam::123456789012:role/r',
                                    web_identity_token_file => current_setting('data_directory') || '/PG_VERSION',
                                    endpoint => 'http://127.0.0.1:4567', sts_endpoint => 'http://127.0.0.1:4567/sts');
SELECT name, aws_access_key_id, aws_role_arn, aws_sts_endpoint FROM outbox.targets WHERE name = 'kw';
SELECT outbox.create_sqs_target('x', 'http://127.0.0.1:4566/123456789012/orders', 'eu-west-1');
SELECT outbox.create_sqs_target('x', 'http://127.0.0.1:4566/123456789012/orders', 'eu-west-1', 'AKIAIOSFODNN7EXAMPLE', 's',
                                role_arn => 'arn:aws:iam::123456789012:role/r', web_identity_token_file => '/x');
SELECT outbox.create_sqs_target('x', 'http://127.0.0.1:4566/123456789012/orders', 'eu-west-1', 'AKIAIOSFODNN7EXAMPLE', 's',
                                web_identity_token_file => '/x');
-- back to an access key
SELECT outbox.set_aws_credentials('sq', 'AKIAIOSFODNN7EXAMPLE', 'secret2');
SELECT name, aws_access_key_id, aws_role_arn, aws_web_identity_token_file FROM outbox.targets WHERE name = 'sq';
SELECT outbox.set_aws_credentials('sq', NULL, NULL);
SELECT outbox.drop_target('kw');
-- the table's own checks, for rows written by hand
\set VERBOSITY terse
INSERT INTO outbox.targets (name, kind, url) VALUES ('x', 'sqs', 'http://127.0.0.1/123456789012/q');
INSERT INTO outbox.targets (name, kind, url, region, aws_access_key_id) VALUES ('x', 'sqs', 'http://127.0.0.1/123456789012/q', 'eu-west-1', 'AKIAIOSFODNN7EXAMPLE');
INSERT INTO outbox.targets (name, kind, url, region, aws_access_key_id, aws_secret_access_key) VALUES ('x', 'kinesis', 'http://127.0.0.1', 'eu-west-1', 'AKIAIOSFODNN7EXAMPLE', 's');
INSERT INTO outbox.targets (name, kind, url, region) VALUES ('x', 'http', 'http://127.0.0.1', 'eu-west-1');
INSERT INTO outbox.targets (name, kind, url, region, aws_access_key_id, aws_secret_access_key, aws_role_arn, aws_web_identity_token_file) VALUES ('x', 'sqs', 'http://127.0.0.1/123456789012/q', 'eu-west-1', 'AKIAIOSFODNN7EXAMPLE', 's', 'arn:aws:iam::123456789012:role/r', '/t');
INSERT INTO outbox.targets (name, kind, url, aws_role_arn, aws_web_identity_token_file) VALUES ('x', 'http', 'http://127.0.0.1', 'arn:aws:iam::123456789012:role/r', '/t');
INSERT INTO outbox.targets (name, kind, url, region, aws_role_arn) VALUES ('x', 'sqs', 'http://127.0.0.1/123456789012/q', 'eu-west-1', 'arn:aws:iam::123456789012:role/r');
\set VERBOSITY default
SELECT outbox.drop_target('sq');
SELECT outbox.drop_target('kn');
SELECT outbox.drop_target('web');
