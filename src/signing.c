/*-------------------------------------------------------------------------
 *
 * signing.c
 *	  Webhook signing keys and signatures, after the Standard Webhooks spec.
 *
 * A target signs with up to two keys (its secret and, while a rotation is
 * under way, its previous secret); webhook-signature then carries both
 * signatures, space-separated.  A key is either
 *	  whsec_<base64 of 16..64 bytes>	symmetric: "v1," base64(HMAC-SHA256(key,
 *										id "." timestamp "." body))
 *	  whsk_<base64 of 32 or 64 bytes>	an ed25519 private key (the 32-byte
 *										seed, or seed and public key as
 *										libsodium writes it): "v1a," base64
 *										(ed25519 signature of the same text)
 * The receiver of a v1a signature holds only the public key,
 * "whpk_" base64(32 bytes), from outbox.signing_public_key(): it can check
 * signatures but not make them.
 *
 * Ed25519 goes through OpenSSL's EVP interface.  An EVP_PKEY is made once
 * per key as it is parsed and freed with the memory context it was parsed
 * in; nothing here raises an error while an OpenSSL object is not yet
 * tracked.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <openssl/evp.h>

#include "common/base64.h"
#include "common/cryptohash.h"
#include "common/hmac.h"
#include "common/sha2.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/resowner.h"

#include "outbox.h"

#define ED25519_KEY_LEN		32
#define ED25519_SIG_LEN		64

/*
 * PostgreSQL's HMAC tracks its OpenSSL context in the current resource
 * owner, and the relay has none between transactions.
 */
static ResourceOwner hmac_owner = NULL;

static void
outbox_free_pkey(void *arg)
{
	EVP_PKEY_free((EVP_PKEY *) arg);
}

/* Decode base64 text of at most maxlen bytes; -1 if it is not base64. */
static int
outbox_b64_decode_text(const char *s, uint8 *out, int maxlen)
{
	int			len = strlen(s);
	const char *p;

	if (len == 0 || pg_b64_dec_len(len) > maxlen + 3)
		return -1;
	for (p = s; *p; p++)
		if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
			  (*p >= '0' && *p <= '9') || *p == '+' || *p == '/' || *p == '='))
			return -1;
	return pg_b64_decode(s, len, (outbox_b64_byte *) out, maxlen + 3);
}

/*
 * Parse a whsec_ or whsk_ key into *key (in the current memory context).
 * Returns NULL, or what is wrong with it.
 */
const char *
outbox_parse_signing_key(const char *text, OutboxSigningKey *key)
{
	uint8		buf[64 + 3];
	int			n;

	memset(key, 0, sizeof(*key));
	if (strncmp(text, "whsec_", 6) == 0)
	{
		n = outbox_b64_decode_text(text + 6, buf, 64);
		if (n < 16 || n > 64)
			return "A whsec_ secret is base64 of 16 to 64 bytes";
		key->kind = 'h';
	}
	else if (strncmp(text, "whsk_", 5) == 0)
	{
		EVP_PKEY   *pkey;
		MemoryContextCallback *cb;

		n = outbox_b64_decode_text(text + 5, buf, 64);
		if (n != ED25519_KEY_LEN && n != 2 * ED25519_KEY_LEN)
			return "A whsk_ key is base64 of a 32-byte ed25519 seed (or of the seed and its public key, 64 bytes)";
		cb = palloc(sizeof(MemoryContextCallback));
		pkey = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, buf, ED25519_KEY_LEN);
		if (pkey == NULL)
		{
			pfree(cb);
			return "OpenSSL could not make an ed25519 key of it";
		}
		cb->func = outbox_free_pkey;
		cb->arg = pkey;
		MemoryContextRegisterResetCallback(CurrentMemoryContext, cb);
		if (n == 2 * ED25519_KEY_LEN)
		{
			uint8		pub[ED25519_KEY_LEN];
			size_t		publen = sizeof(pub);

			if (EVP_PKEY_get_raw_public_key(pkey, pub, &publen) != 1 ||
				publen != ED25519_KEY_LEN ||
				memcmp(pub, buf + ED25519_KEY_LEN, ED25519_KEY_LEN) != 0)
				return "The last 32 bytes of this whsk_ key are not the public key of its first 32";
			n = ED25519_KEY_LEN;
		}
		key->kind = 'e';
		key->pkey = pkey;
	}
	else
		return "A key starts with whsec_ (HMAC-SHA256) or whsk_ (ed25519)";
	key->bytes = palloc(n);
	memcpy(key->bytes, buf, n);
	key->len = n;
	return NULL;
}

/* Append len bytes of data to out in base64 (RFC 4648, padded). */
void
outbox_append_b64(StringInfo out, const uint8 *data, int len)
{
	int			n;

	enlargeStringInfo(out, pg_b64_enc_len(len) + 1);
	n = pg_b64_encode((const outbox_b64_byte *) data, len, out->data + out->len,
					  out->maxlen - out->len);
	if (n < 0)
		elog(ERROR, "outbox: could not encode bytes in base64");
	out->len += n;
	out->data[out->len] = '\0';
}

/* "v1," base64(HMAC-SHA256(key, id "." timestamp "." body)) */
static void
outbox_sign_hmac(const OutboxSigningKey *key, const char *webhook_id,
				 const char *timestamp, const char *body, int body_len,
				 StringInfo out)
{
	ResourceOwner saved_owner = CurrentResourceOwner;
	pg_hmac_ctx *ctx;
	uint8		mac[PG_SHA256_DIGEST_LENGTH];

	if (saved_owner == NULL)
	{
		if (hmac_owner == NULL)
			hmac_owner = ResourceOwnerCreate(NULL, "outbox webhook signatures");
		CurrentResourceOwner = hmac_owner;
	}
	ctx = pg_hmac_create(PG_SHA256);
	if (ctx == NULL ||
		pg_hmac_init(ctx, key->bytes, key->len) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) webhook_id, strlen(webhook_id)) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) ".", 1) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) timestamp, strlen(timestamp)) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) ".", 1) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) body, body_len) < 0 ||
		pg_hmac_final(ctx, mac, sizeof(mac)) < 0)
	{
		char	   *why = pstrdup(ctx ? pg_hmac_error(ctx) : "out of memory");

		/* Free the context and restore the owner before raising. */
		if (ctx)
			pg_hmac_free(ctx);
		CurrentResourceOwner = saved_owner;
		elog(ERROR, "outbox: could not compute a webhook signature: %s", why);
	}
	pg_hmac_free(ctx);
	CurrentResourceOwner = saved_owner;
	appendStringInfoString(out, "v1,");
	outbox_append_b64(out, mac, sizeof(mac));
}

/* "v1a," base64(ed25519(id "." timestamp "." body)) */
static void
outbox_sign_ed25519(const OutboxSigningKey *key, const char *webhook_id,
					const char *timestamp, const char *body, int body_len,
					StringInfo out)
{
	size_t		idlen = strlen(webhook_id);
	size_t		tslen = strlen(timestamp);
	size_t		len = idlen + 1 + tslen + 1 + body_len;
	uint8	   *text = palloc(len);
	uint8		sig[ED25519_SIG_LEN];
	size_t		siglen = sizeof(sig);
	EVP_MD_CTX *ctx;
	bool		ok;

	/* Ed25519 signs a message whole: no streaming. */
	memcpy(text, webhook_id, idlen);
	text[idlen] = '.';
	memcpy(text + idlen + 1, timestamp, tslen);
	text[idlen + 1 + tslen] = '.';
	memcpy(text + idlen + tslen + 2, body, body_len);

	ctx = EVP_MD_CTX_new();
	ok = ctx != NULL &&
		EVP_DigestSignInit(ctx, NULL, NULL, NULL, (EVP_PKEY *) key->pkey) == 1 &&
		EVP_DigestSign(ctx, sig, &siglen, text, len) == 1 &&
		siglen == ED25519_SIG_LEN;
	EVP_MD_CTX_free(ctx);
	pfree(text);
	if (!ok)
		elog(ERROR, "outbox: OpenSSL could not make an ed25519 signature");
	appendStringInfoString(out, "v1a,");
	outbox_append_b64(out, sig, sizeof(sig));
}

/* Append the signature of a request with key to out. */
bool
outbox_sign(const OutboxSigningKey *key, const char *webhook_id,
			const char *timestamp, const char *body, int body_len,
			StringInfo out)
{
	if (key->kind == 'h')
		outbox_sign_hmac(key, webhook_id, timestamp, body, body_len, out);
	else if (key->kind == 'e')
		outbox_sign_ed25519(key, webhook_id, timestamp, body, body_len, out);
	else
		return false;
	return true;
}

PG_FUNCTION_INFO_V1(outbox_signing_public_key);

/*
 * outbox.signing_public_key(secret text) -> text
 *
 * The whpk_ public key of a whsk_ key, for the receiver.
 */
Datum
outbox_signing_public_key(PG_FUNCTION_ARGS)
{
	char	   *secret = text_to_cstring(PG_GETARG_TEXT_PP(0));
	OutboxSigningKey key;
	const char *why = outbox_parse_signing_key(secret, &key);
	uint8		pub[ED25519_KEY_LEN];
	size_t		publen = sizeof(pub);
	StringInfoData out;

	if (why == NULL && key.kind != 'e')
		why = "A whsec_ secret is symmetric: the receiver holds the same secret";
	if (why != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("not an ed25519 signing key"),
				 errdetail("%s.", why),
				 errhint("Make one with outbox.generate_secret('ed25519').")));
	if (EVP_PKEY_get_raw_public_key((EVP_PKEY *) key.pkey, pub, &publen) != 1 ||
		publen != ED25519_KEY_LEN)
		elog(ERROR, "outbox: OpenSSL could not give the public key");
	initStringInfo(&out);
	appendStringInfoString(&out, "whpk_");
	outbox_append_b64(&out, pub, sizeof(pub));
	PG_RETURN_TEXT_P(cstring_to_text(out.data));
}

PG_FUNCTION_INFO_V1(outbox_generate_secret);

/*
 * outbox.generate_secret(kind text DEFAULT 'hmac') -> text
 *
 * A new random key: 'hmac' gives whsec_ (32 bytes), 'ed25519' whsk_.
 */
Datum
outbox_generate_secret(PG_FUNCTION_ARGS)
{
	char	   *kind = PG_ARGISNULL(0) ? "hmac" : text_to_cstring(PG_GETARG_TEXT_PP(0));
	uint8		bytes[32];
	StringInfoData out;

	if (strcmp(kind, "hmac") != 0 && strcmp(kind, "ed25519") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("unknown signing key kind \"%s\"", kind),
				 errhint("Use 'hmac' (whsec_, Standard Webhooks v1) or 'ed25519' (whsk_, v1a).")));
	if (!pg_strong_random(bytes, sizeof(bytes)))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate random bytes for a signing key")));
	initStringInfo(&out);
	appendStringInfoString(&out, kind[0] == 'h' ? "whsec_" : "whsk_");
	outbox_append_b64(&out, bytes, sizeof(bytes));
	explicit_bzero(bytes, sizeof(bytes));
	PG_RETURN_TEXT_P(cstring_to_text(out.data));
}
