/*-------------------------------------------------------------------------
 *
 * relay_tls.c
 *	  TLS of the socket transports' connections (relay_conn.c), with
 *	  OpenSSL.  All OpenSSL use of the connections is here.
 *
 * A connection that asks for TLS gets its session from a context made for
 * the target's files: TLS 1.2 or later, the peer's chain verified against the
 * target's ca_file (or the system's store when it has none), the host name
 * (or address) of the url checked against the certificate, SNI for a name,
 * and the target's client certificate and key when it has them.  There is
 * no way to turn verification off, as for HTTP targets.
 *
 * Contexts are kept (TLS_CACHE_SIZE, the least recently used one
 * replaced): making one costs about a millisecond of the relay's thread
 * (OpenSSL 3's context, the files parsed), which a target whose server
 * never answers would pay at every attempt.  One is used again only for
 * the same files, unchanged on disk (device, inode, size, modification and
 * change times, looked at with stat() at each connection), so files named
 * anew by alter_target() or replaced in place are read by the next
 * connection.  (The system's store is keyed by its bundle file; its
 * directory of hashed certificates is read as certificates are looked
 * for, whatever the cache.)
 *
 * Everything is non-blocking: the handshake, reads and writes say when
 * they want the socket readable or writable, and the relay's loop waits
 * for that.  OpenSSL runs no thread; its objects are malloc'd, freed by
 * relay_tls_free().
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/stat.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "relay.h"

/*
 * OpenSSL's passphrase callback: there is none to give (its default would
 * read a terminal, or the postmaster's stdin, and wait).
 */
static int
tls_no_passphrase(char *buf, int size, int rwflag, void *userdata)
{
	return 0;
}

/* The OpenSSL error queue's first reason, or what, emptied. */
static void
tls_reason(char *out, size_t size, const char *what)
{
	unsigned long e = ERR_get_error();
	const char *r = e != 0 ? ERR_reason_error_string(e) : NULL;

	snprintf(out, size, "%s", r != NULL ? r : what);
	ERR_clear_error();
}

/* Contexts kept. */
#define TLS_CACHE_SIZE	16

/* What a file was when a context read it (all zero: none, or missing). */
typedef struct TlsFileId
{
	dev_t		dev;
	ino_t		ino;
	off_t		size;
	struct timespec mtime;
	struct timespec ctime;		/* (no one can set it: a copy that kept
								 * the modification time still changes it) */
} TlsFileId;

/* A context kept, for the files named (malloc'd copies; NULL: none). */
typedef struct TlsCached
{
	SSL_CTX    *ctx;
	char	   *names[3];		/* ca_file (NULL: the system's store),
								 * client_cert, client_key */
	TlsFileId	ids[3];			/* ca_file's: the system store's file then */
	uint64		used;			/* when last used, in uses */
} TlsCached;

static TlsCached tls_cache[TLS_CACHE_SIZE];
static uint64 tls_uses = 0;

static void
tls_file_id(const char *path, TlsFileId *id)
{
	struct stat st;

	memset(id, 0, sizeof(*id));
	if (path == NULL || stat(path, &st) != 0)
		return;
	id->dev = st.st_dev;
	id->ino = st.st_ino;
	id->size = st.st_size;
	id->mtime = st.st_mtim;
	id->ctime = st.st_ctim;
}

/* The files a context for tls reads, and what they are on disk now. */
static void
tls_files_now(const RelayConnTls *tls, const char **names, TlsFileId *ids)
{
	names[0] = tls->ca_file;
	names[1] = tls->client_cert;
	names[2] = tls->client_key;
	if (tls->ca_file != NULL)
		tls_file_id(tls->ca_file, &ids[0]);
	else
	{
		/* the system's store: the file OpenSSL reads, as it finds it */
		const char *env = getenv(X509_get_default_cert_file_env());

		tls_file_id(env != NULL ? env : X509_get_default_cert_file(), &ids[0]);
	}
	tls_file_id(tls->client_cert, &ids[1]);
	tls_file_id(tls->client_key, &ids[2]);
}

static bool
tls_same_name(const char *a, const char *b)
{
	return (a == NULL) == (b == NULL) && (a == NULL || strcmp(a, b) == 0);
}

/* The kept context for these files as they are now, or NULL. */
static SSL_CTX *
tls_cache_get(const char **names, const TlsFileId *ids)
{
	int			i,
				k;

	for (i = 0; i < TLS_CACHE_SIZE; i++)
	{
		TlsCached  *c = &tls_cache[i];

		if (c->ctx == NULL)
			continue;
		for (k = 0; k < 3; k++)
			if (!tls_same_name(c->names[k], names[k]) ||
				memcmp(&c->ids[k], &ids[k], sizeof(TlsFileId)) != 0)
				break;
		if (k == 3)
		{
			c->used = ++tls_uses;
			return c->ctx;
		}
	}
	return NULL;
}

static void
tls_cache_drop(TlsCached *c)
{
	int			k;

	if (c->ctx != NULL)
		SSL_CTX_free(c->ctx);
	for (k = 0; k < 3; k++)
		free(c->names[k]);
	memset(c, 0, sizeof(*c));
}

/*
 * Keep ctx (a reference of its own) for these files, in place of a context
 * for the same names (files since changed) or of the least recently used
 * one.  Nothing is kept when memory is short.
 */
static void
tls_cache_put(SSL_CTX *ctx, const char **names, const TlsFileId *ids)
{
	TlsCached  *victim = &tls_cache[0];
	int			i,
				k;

	for (i = 0; i < TLS_CACHE_SIZE; i++)
	{
		TlsCached  *c = &tls_cache[i];

		for (k = 0; k < 3 && c->ctx != NULL; k++)
			if (!tls_same_name(c->names[k], names[k]))
				break;
		if (c->ctx == NULL || k == 3)
		{
			victim = c;
			break;
		}
		if (c->used < victim->used)
			victim = c;
	}
	tls_cache_drop(victim);
	for (k = 0; k < 3; k++)
	{
		if (names[k] != NULL && (victim->names[k] = strdup(names[k])) == NULL)
		{
			tls_cache_drop(victim);
			return;
		}
		victim->ids[k] = ids[k];
	}
	if (SSL_CTX_up_ref(ctx) != 1)
	{
		tls_cache_drop(victim);
		return;
	}
	victim->ctx = ctx;
	victim->used = ++tls_uses;
}

/* A new context for the files of tls, or NULL with error. */
static SSL_CTX *
tls_ctx_new(const RelayConnTls *tls, char *error, size_t size)
{
	SSL_CTX    *ctx;
	char		why[160];

	ctx = SSL_CTX_new(TLS_client_method());
	if (ctx == NULL)
	{
		snprintf(error, size, "could not create a TLS context: out of memory");
		return NULL;
	}
	(void) SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	/* a peer may not start a handshake again in the middle of our writes */
	SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION);
	SSL_CTX_set_default_passwd_cb(ctx, tls_no_passphrase);
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	if (tls->ca_file != NULL)
	{
		if (SSL_CTX_load_verify_locations(ctx, tls->ca_file, NULL) != 1)
		{
			tls_reason(why, sizeof(why), "unknown error");
			snprintf(error, size, "could not load ca_file \"%s\": %s", tls->ca_file, why);
			goto fail;
		}
	}
	else if (SSL_CTX_set_default_verify_paths(ctx) != 1)
	{
		tls_reason(why, sizeof(why), "unknown error");
		snprintf(error, size, "could not load the system's certificate store: %s", why);
		goto fail;
	}
	if (tls->client_cert != NULL)
	{
		if (SSL_CTX_use_certificate_chain_file(ctx, tls->client_cert) != 1)
		{
			tls_reason(why, sizeof(why), "unknown error");
			snprintf(error, size, "could not load client_cert \"%s\": %s", tls->client_cert, why);
			goto fail;
		}
		if (SSL_CTX_use_PrivateKey_file(ctx, tls->client_key ? tls->client_key : tls->client_cert,
										SSL_FILETYPE_PEM) != 1)
		{
			tls_reason(why, sizeof(why), "unknown error");
			snprintf(error, size, "could not load client_key \"%s\": %s (an encrypted key is not taken: the relay has no passphrase to give)",
					 tls->client_key ? tls->client_key : tls->client_cert, why);
			goto fail;
		}
		if (SSL_CTX_check_private_key(ctx) != 1)
		{
			snprintf(error, size, "client_key does not match client_cert");
			goto fail;
		}
	}
	return ctx;

fail:
	SSL_CTX_free(ctx);
	return NULL;
}

/*
 * A TLS session on the connected socket fd, for host (a name or an
 * address).  Returns NULL with error when the files cannot be used.
 */
void *
relay_tls_new(int fd, const char *host, const RelayConnTls *tls, char *error, size_t size)
{
	SSL_CTX    *ctx;
	SSL		   *ssl = NULL;
	unsigned char addr[16];
	bool		is_addr;
	const char *names[3];
	TlsFileId	ids[3];

	ERR_clear_error();
	tls_files_now(tls, names, ids);
	ctx = tls_cache_get(names, ids);
	if (ctx != NULL)
		SSL_CTX_up_ref(ctx);	/* this call's reference, as a new one has */
	else
	{
		ctx = tls_ctx_new(tls, error, size);
		if (ctx == NULL)
		{
			ERR_clear_error();
			return NULL;
		}
		tls_cache_put(ctx, names, ids);
	}
	ssl = SSL_new(ctx);
	if (ssl == NULL || SSL_set_fd(ssl, fd) != 1)
	{
		snprintf(error, size, "could not create a TLS session: out of memory");
		goto fail;
	}
	is_addr = inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1;
	if (is_addr)
	{
		if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host) != 1)
		{
			snprintf(error, size, "could not set the address \"%s\" to verify", host);
			goto fail;
		}
	}
	else if (SSL_set_tlsext_host_name(ssl, host) != 1 || SSL_set1_host(ssl, host) != 1)
	{
		snprintf(error, size, "could not set the host name \"%s\" to verify", host);
		goto fail;
	}
	SSL_set_connect_state(ssl);
	/* the session holds its own reference */
	SSL_CTX_free(ctx);
	return ssl;

fail:
	if (ssl != NULL)
		SSL_free(ssl);
	SSL_CTX_free(ctx);
	ERR_clear_error();
	return NULL;
}

/*
 * Whether the TLS files load (as relay_tls_new() loads them), for a
 * library that loads them itself and would prompt for a passphrase (NATS):
 * false with error.
 */
bool
relay_tls_files_load(const RelayConnTls *tls, char *error, size_t size)
{
	/* a session on no socket: only the files matter, nothing is sent */
	void	   *ssl = relay_tls_new(-1, "localhost", tls, error, size);

	relay_tls_free(ssl);
	return ssl != NULL;
}

void
relay_tls_free(void *ssl)
{
	if (ssl == NULL)
		return;
	/* no close_notify: the socket is closed at once, as on any failure */
	SSL_free((SSL *) ssl);
	ERR_clear_error();
}

/*
 * What a failed TLS call was, into error, with a hint when the server seems
 * not to speak TLS at all.
 */
static void
tls_failure(SSL *ssl, int rc, const char *peer, bool handshake, char *error, size_t size)
{
	int			err = SSL_get_error(ssl, rc);
	unsigned long e = ERR_peek_error();
	long		verify = SSL_get_verify_result(ssl);
	char		why[160];

	if (handshake && verify != X509_V_OK)
		snprintf(error, size, "the certificate of %s was not accepted: %s", peer,
				 X509_verify_cert_error_string(verify));
	else if (err == SSL_ERROR_SYSCALL && e == 0)
		snprintf(error, size, "%s at %s: %s", handshake ? "the TLS handshake failed" : "the TLS connection was lost",
				 peer, errno != 0 && rc < 0 ? strerror(errno) : "closed by the server");
	else
	{
		tls_reason(why, sizeof(why), "unknown error");
		snprintf(error, size, "%s at %s: %s%s",
				 handshake ? "the TLS handshake failed" : "the TLS connection failed",
				 peer, why,
				 ERR_GET_REASON(e) == SSL_R_WRONG_VERSION_NUMBER ||
				 ERR_GET_REASON(e) == SSL_R_PACKET_LENGTH_TOO_LONG ?
				 " (does the server speak TLS on this port? a plaintext server needs a url without TLS)" : "");
	}
	ERR_clear_error();
}

/*
 * Go on with the handshake: 1 done, 0 wants the socket (*want_write says
 * which way), -1 failed with error.
 */
int
relay_tls_handshake(void *s, const char *peer, bool *want_write, char *error, size_t size)
{
	SSL		   *ssl = (SSL *) s;
	int			rc;

	ERR_clear_error();
	errno = 0;
	rc = SSL_do_handshake(ssl);
	if (rc == 1)
		return 1;
	switch (SSL_get_error(ssl, rc))
	{
		case SSL_ERROR_WANT_READ:
			*want_write = false;
			return 0;
		case SSL_ERROR_WANT_WRITE:
			*want_write = true;
			return 0;
		default:
			tls_failure(ssl, rc, peer, true, error, size);
			return -1;
	}
}

/*
 * Read up to len bytes: > 0 read, 0 nothing now (*want_write: it waits for
 * the socket to be writable), -1 closed or failed, with error.
 */
int
relay_tls_read(void *s, char *buf, int len, const char *peer, bool *want_write, char *error, size_t size)
{
	SSL		   *ssl = (SSL *) s;
	int			rc;

	ERR_clear_error();
	errno = 0;
	rc = SSL_read(ssl, buf, len);
	*want_write = false;
	if (rc > 0)
		return rc;
	switch (SSL_get_error(ssl, rc))
	{
		case SSL_ERROR_WANT_READ:
			return 0;
		case SSL_ERROR_WANT_WRITE:
			*want_write = true;
			return 0;
		case SSL_ERROR_ZERO_RETURN:
			snprintf(error, size, "closed by the server");
			return -1;
		default:
			tls_failure(ssl, rc, peer, false, error, size);
			return -1;
	}
}

/*
 * Write up to len bytes: > 0 written, 0 not now (*want_read: it waits for
 * the socket to be readable), -1 failed, with error.
 */
int
relay_tls_write(void *s, const char *buf, int len, const char *peer, bool *want_read, char *error, size_t size)
{
	SSL		   *ssl = (SSL *) s;
	int			rc;

	ERR_clear_error();
	errno = 0;
	rc = SSL_write(ssl, buf, len);
	*want_read = false;
	if (rc > 0)
		return rc;
	switch (SSL_get_error(ssl, rc))
	{
		case SSL_ERROR_WANT_WRITE:
			return 0;
		case SSL_ERROR_WANT_READ:
			*want_read = true;
			return 0;
		default:
			tls_failure(ssl, rc, peer, false, error, size);
			return -1;
	}
}

/* Bytes decrypted and not yet read (the socket may not say so again). */
bool
relay_tls_pending(void *s)
{
	return s != NULL && SSL_pending((SSL *) s) > 0;
}
