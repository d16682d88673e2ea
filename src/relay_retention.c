/*-------------------------------------------------------------------------
 *
 * relay_retention.c
 *	  Retention: the relay empties finished chunks of outbox.messages (I8).
 *
 * Messages are stored in chunk tables (outbox.messages_1 .. _4, see
 * outbox--0.1--0.2.sql).  About once a second the relay runs
 * outbox.retention_step(), which TRUNCATEs every chunk that may go and
 * moves the current chunk on, then publishes the current chunk in shared
 * memory for committers.  The step takes its locks without waiting (the
 * extension itself and its tables, outbox_fence_extension_drop, and each
 * chunk it empties), so that it never waits for a table while it holds
 * another and a DROP EXTENSION never fails with a deadlock against it;
 * what keeps a chunk (a lock held elsewhere, a target behind, the
 * retention window) is kept for outbox.worker.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "mb/pg_wchar.h"
#include "pgstat.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "nodes/value.h"
#include "parser/parse_func.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "base.h"
#include "relay.h"

/* How often the step runs. */
#define RELAY_RETENTION_INTERVAL_MS	1000

static TimestampTz last_step = 0;
static int	relay_retention_chunk = 0;	/* current chunk the step returned */
static TimestampTz last_warning = 0;

/* Run the step; returns false on a schema without retention (0.1). */
static bool
relay_retention_run(void)
{
	static SPIPlanPtr plan = NULL;
	Datum		arg;
	bool		isnull;
	int			chunk;
	char	   *held = NULL;

	{
		Oid			argtypes[1] = {INTERVALOID};
		List	   *name = list_make1(makeString("outbox"));

		name = lappend(name, makeString("retention_step"));

		if (!OidIsValid(LookupFuncName(name, 1, argtypes, true)))
			return false;		/* schema 0.1 */
	}
	if (plan == NULL)
	{
		Oid			argtypes[1] = {INT4OID};

		plan = SPI_prepare("SELECT current_chunk, held_by"
						   "  FROM outbox.retention_step(pg_catalog.make_interval(secs => $1))",
						   1, argtypes);
		if (plan == NULL)
			elog(ERROR, "outbox: could not prepare the retention step");
		SPI_keepplan(plan);
	}
	arg = Int32GetDatum(outbox_retention);
	if (SPI_execute_plan(plan, &arg, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "outbox: the retention step returned no row");
	chunk = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	if (isnull)
		chunk = 0;
	held = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
	outbox_set_retention_status(held, GetCurrentTimestamp());
	/* Published only once committed: before that it is not current. */
	relay_retention_chunk = chunk;
	return true;
}

/*
 * Run a retention step when one is due; returns the milliseconds until the
 * next is due.  A failure is reported (at most once a minute) and retried;
 * it never stops delivery.
 */
long
relay_retention_maybe(TimestampTz now)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	long		elapsed_ms = (long) ((now - last_step) / 1000);

	if (last_step != 0 && elapsed_ms >= 0 && elapsed_ms < RELAY_RETENTION_INTERVAL_MS)
		return RELAY_RETENTION_INTERVAL_MS - elapsed_ms;
	last_step = now;

	relay_retention_chunk = 0;
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	pgstat_report_activity(STATE_RUNNING, "outbox retention");
	PG_TRY();
	{
		const char *busy;

		SPI_connect();
		PushActiveSnapshot(GetTransactionSnapshot());
		busy = outbox_fence_extension_drop();
		if (busy != NULL)
		{
			/*
			 * Something another session holds (or the extension gone,
			 * which the relay learns elsewhere): the next turn.
			 */
			if (*busy != '\0')
				outbox_set_retention_status(busy, now);
		}
		else
		{
			outbox_queue_compact();
			(void) relay_retention_run();
		}
		PopActiveSnapshot();
		SPI_finish();
		CommitTransactionCommand();
		outbox_queue_compact_done(true);
		if (relay_retention_chunk > 0)
			outbox_set_current_chunk(relay_retention_chunk);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
		outbox_queue_compact_done(false);
		/* The extension was dropped meanwhile: the relay stops. */
		if (!outbox_extension_installed())
			ReThrowError(edata);
		if (edata->sqlerrcode == ERRCODE_LOCK_NOT_AVAILABLE)
		{
			/*
			 * A row another session has locked, waited for as long as the
			 * step may: what holds retention back, not a failure.  (Its
			 * statement: the first line of the error's context.)
			 */
			char		held[256];
			const char *what = edata->context ? edata->context : edata->message;
			int			len = pg_mbcliplen(what, (int) strcspn(what, "\n"), 200);

			snprintf(held, sizeof(held), "a row lock another session holds (%.*s)", len, what);
			outbox_set_retention_status(held, now);
		}
		else
			outbox_set_retention_status(edata->message, now);
		if (edata->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE &&
			(last_warning == 0 || TimestampDifferenceExceeds(last_warning, now, 60 * 1000)))
		{
			ereport(WARNING,
					(errmsg("outbox relay could not remove delivered messages: %s", edata->message),
					 errhint("Messages are kept until this succeeds; it is retried every second.")));
			last_warning = now;
		}
		FreeErrorData(edata);
	}
	PG_END_TRY();
	MemoryContextSwitchTo(oldcxt);
	pgstat_report_activity(STATE_IDLE, NULL);
	return RELAY_RETENTION_INTERVAL_MS;
}
