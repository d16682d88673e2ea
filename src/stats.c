/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  Delivery statistics in shared memory, and the functions behind the
 *	  views outbox.stats, outbox.worker and outbox.metrics().
 *
 * The relay counts in its own memory (RelayTarget.stats) and publishes a
 * copy here every RELAY_STATS_INTERVAL_MS; readers copy it out under a
 * spinlock.  Nothing is written to a table, so the views cost the same
 * whatever the traffic.  Latency is a histogram of fixed buckets: since
 * the last reset (for Prometheus), and over a recent window of two
 * half-windows (for the percentiles of outbox.stats).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/array.h"
#include "utils/float.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_target_stats);
PG_FUNCTION_INFO_V1(outbox_target_filtered);
PG_FUNCTION_INFO_V1(outbox_worker_status);
PG_FUNCTION_INFO_V1(outbox_reset_stats);
PG_FUNCTION_INFO_V1(outbox_relays);

/* Upper bounds of the latency buckets, in ms; the last bucket is +Inf. */
const double outbox_latency_bounds_ms[OUTBOX_LATENCY_BUCKETS - 1] = {
	1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000,
	60000, 300000
};

/* One database's figures, in the entry of its directory slot (shmem.c). */
typedef struct OutboxStatsShared
{
	pg_atomic_uint64 reset_generation;	/* bumped by outbox.reset_stats() */
	slock_t		mutex;			/* protects everything below */
	Oid			dboid;			/* whose relay published them last */
	OutboxWorkerStatus worker;
	int			ntargets;		/* entries of targets in use */
	OutboxTargetStats targets[OUTBOX_MAX_STAT_TARGETS];
} OutboxStatsShared;

static OutboxStatsShared *StatsArray = NULL;

Size
outbox_stats_shmem_size(void)
{
	return mul_size(outbox_max_databases, sizeof(OutboxStatsShared));
}

/* Called from the shmem startup hook, under AddinShmemInitLock. */
void
outbox_stats_shmem_init(void)
{
	bool		found;

	StatsArray = ShmemInitStruct("outbox stats", outbox_stats_shmem_size(), &found);
	if (!found)
	{
		int			i;

		memset(StatsArray, 0, outbox_stats_shmem_size());
		for (i = 0; i < outbox_max_databases; i++)
		{
			pg_atomic_init_u64(&StatsArray[i].reset_generation, 0);
			SpinLockInit(&StatsArray[i].mutex);
		}
	}
}

/*
 * The figures of this backend's database (its slot is taken if need be).
 * Figures another database's relay left in the slot are not this one's:
 * readers see none until this database's relay publishes.
 */
static OutboxStatsShared *
outbox_my_stats(void)
{
	outbox_db_attach();
	return &StatsArray[outbox_db_index()];
}

/* The bucket of a latency. */
static int
outbox_latency_bucket(double ms)
{
	int			i;

	for (i = 0; i < OUTBOX_LATENCY_BUCKETS - 1; i++)
		if (ms <= outbox_latency_bounds_ms[i])
			return i;
	return OUTBOX_LATENCY_BUCKETS - 1;
}

/* Move the recent window on when its half is over. */
static void
outbox_stats_roll(OutboxTargetStats *s, TimestampTz now)
{
	if (s->window_start == 0)
		s->window_start = now;
	if (!TimestampDifferenceExceeds(s->window_start, now, OUTBOX_WINDOW_HALF_MS))
		return;
	if (TimestampDifferenceExceeds(s->window_start, now, 2 * OUTBOX_WINDOW_HALF_MS))
	{
		memset(s->window[1], 0, sizeof(s->window[1]));
		s->window_max_ms[1] = 0;
	}
	else
	{
		memcpy(s->window[1], s->window[0], sizeof(s->window[1]));
		s->window_max_ms[1] = s->window_max_ms[0];
	}
	memset(s->window[0], 0, sizeof(s->window[0]));
	s->window_max_ms[0] = 0;
	s->window_start = now;
}

/* One message acknowledged ms after it was emitted (relay memory). */
void
outbox_stats_latency(OutboxTargetStats *s, double ms, TimestampTz now)
{
	int			b;

	if (ms < 0)
		ms = 0;
	b = outbox_latency_bucket(ms);
	outbox_stats_roll(s, now);
	s->hist[b]++;
	s->latency_sum_ms += ms;
	s->window[0][b]++;
	s->window_max_ms[0] = Max(s->window_max_ms[0], ms);
}

/* The relay publishes its status and its targets' statistics. */
void
outbox_stats_publish(const OutboxWorkerStatus *worker,
					 const OutboxTargetStats *targets, int ntargets)
{
	OutboxStatsShared *st = outbox_my_stats();

	ntargets = Min(ntargets, OUTBOX_MAX_STAT_TARGETS);
	SpinLockAcquire(&st->mutex);
	st->dboid = MyDatabaseId;
	st->worker = *worker;
	if (ntargets > 0)
		memcpy(st->targets, targets, sizeof(OutboxTargetStats) * ntargets);
	st->ntargets = ntargets;
	SpinLockRelease(&st->mutex);
}

/*
 * The reset generation: the relay zeroes its counters when it moves.  Read
 * at every turn of the relay's loop, so without a lock.
 */
uint64
outbox_stats_reset_generation(void)
{
	return pg_atomic_read_u64(&outbox_my_stats()->reset_generation);
}

/*
 * Whether this database has an outbox slot, or should (it is served): a
 * database the relays do not serve takes none for a view.
 */
static bool
outbox_stats_here(void)
{
	return outbox_db_lookup() || outbox_this_database_served();
}

static void
outbox_stats_check(void)
{
	if (StatsArray == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox statistics need the outbox library preloaded"),
				 errhint("Add outbox to shared_preload_libraries and restart the server.")));
}

/* Percentile q (0..1) of a histogram, interpolated inside its bucket. */
static double
outbox_percentile(const uint64 *h, uint64 total, double q, double max_ms)
{
	double		want = q * total;
	uint64		seen = 0;
	int			i;

	for (i = 0; i < OUTBOX_LATENCY_BUCKETS; i++)
	{
		if (h[i] > 0 && seen + h[i] >= want)
		{
			double		lo = i == 0 ? 0 : outbox_latency_bounds_ms[i - 1];
			double		hi = i == OUTBOX_LATENCY_BUCKETS - 1 ? max_ms :
				outbox_latency_bounds_ms[i];

			hi = Min(hi, max_ms);
			lo = Min(lo, hi);
			return lo + (hi - lo) * ((want - seen) / h[i]);
		}
		seen += h[i];
	}
	return max_ms;
}

/* A palloc'd copy of this database's target figures; *n of them. */
static OutboxTargetStats *
outbox_stats_copy(int *n)
{
	OutboxTargetStats *copy = palloc(sizeof(OutboxTargetStats) * OUTBOX_MAX_STAT_TARGETS);
	OutboxStatsShared *st = outbox_my_stats();

	SpinLockAcquire(&st->mutex);
	*n = st->dboid == MyDatabaseId ? st->ntargets : 0;
	memcpy(copy, st->targets, sizeof(OutboxTargetStats) * *n);
	SpinLockRelease(&st->mutex);
	return copy;
}

/*
 * outbox.target_filtered(): per target the relay serves, the messages its
 * subscriptions' filters turned away since the relay started (or the
 * counters were reset); in outbox.stats.
 */
Datum
outbox_target_filtered(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	OutboxTargetStats *copy;
	int			n;
	int			i;

	outbox_stats_check();
	InitMaterializedSRF(fcinfo, 0);
	if (!outbox_stats_here())
		return (Datum) 0;

	copy = outbox_stats_copy(&n);
	for (i = 0; i < n; i++)
	{
		Datum		values[2];
		bool		nulls[2] = {false, false};

		values[0] = Int32GetDatum(copy[i].target_id);
		values[1] = Int64GetDatum((int64) copy[i].filtered);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	pfree(copy);
	return (Datum) 0;
}

/*
 * outbox.target_stats(): one row per target the relay serves, from shared
 * memory (see the outbox.stats view for the columns).
 */
Datum
outbox_target_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	OutboxTargetStats *copy;
	int			n;
	int			i;
	TimestampTz now = GetCurrentTimestamp();
	Datum		bounds[OUTBOX_LATENCY_BUCKETS];

	outbox_stats_check();
	InitMaterializedSRF(fcinfo, 0);
	if (!outbox_stats_here())
		return (Datum) 0;

	copy = outbox_stats_copy(&n);

	for (i = 0; i < OUTBOX_LATENCY_BUCKETS - 1; i++)
		bounds[i] = Float8GetDatum(outbox_latency_bounds_ms[i]);
	bounds[OUTBOX_LATENCY_BUCKETS - 1] = Float8GetDatum(get_float8_infinity());

	for (i = 0; i < n; i++)
	{
		OutboxTargetStats *s = &copy[i];
		Datum		values[20];
		bool		nulls[20];
		uint64		window[OUTBOX_LATENCY_BUCKETS];
		Datum		counts[OUTBOX_LATENCY_BUCKETS];
		uint64		wtotal = 0;
		uint64		total = 0;
		double		wmax;
		int			b;
		const char *state;

		memset(nulls, 0, sizeof(nulls));
		outbox_stats_roll(s, now);	/* ages the window on our copy */
		for (b = 0; b < OUTBOX_LATENCY_BUCKETS; b++)
		{
			window[b] = s->window[0][b] + s->window[1][b];
			wtotal += window[b];
			total += s->hist[b];
			counts[b] = Int64GetDatum((int64) s->hist[b]);
		}
		wmax = Max(s->window_max_ms[0], s->window_max_ms[1]);
		switch (s->state)
		{
			case 'p':
				state = "paused";
				break;
			case 'x':
				state = "disabled";
				break;
			case 'f':
				state = "failing";
				break;
			case 'r':
				state = "retrying";
				break;
			case 'd':
				state = "delivering";
				break;
			case 'w':
				state = "waiting for standby";
				break;
			default:
				state = "idle";
				break;
		}
		values[0] = Int32GetDatum(s->target_id);
		values[1] = CStringGetTextDatum(state);
		values[2] = Int32GetDatum(s->in_flight);
		values[3] = Int32GetDatum(s->failed_attempts);
		values[4] = TimestampTzGetDatum(s->last_success_at);
		nulls[4] = s->last_success_at == 0;
		values[5] = Int64GetDatum((int64) s->messages);
		values[6] = Int64GetDatum((int64) s->requests);
		values[7] = Int64GetDatum((int64) s->bytes);
		values[8] = Int64GetDatum((int64) s->retries);
		values[9] = Int64GetDatum((int64) s->dead_letters);
		values[10] = Float8GetDatum(outbox_percentile(window, wtotal, 0.50, wmax));
		values[11] = Float8GetDatum(outbox_percentile(window, wtotal, 0.90, wmax));
		values[12] = Float8GetDatum(outbox_percentile(window, wtotal, 0.99, wmax));
		values[13] = Float8GetDatum(wmax);
		nulls[10] = nulls[11] = nulls[12] = nulls[13] = (wtotal == 0);
		values[14] = Int64GetDatum((int64) wtotal);
		values[15] = PointerGetDatum(construct_array(bounds, OUTBOX_LATENCY_BUCKETS, FLOAT8OID,
													 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
		values[16] = PointerGetDatum(construct_array(counts, OUTBOX_LATENCY_BUCKETS, INT8OID,
													 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
		values[17] = Float8GetDatum(s->latency_sum_ms);
		values[18] = Int64GetDatum((int64) total);
		values[19] = TimestampTzGetDatum(s->reset_at);
		nulls[19] = s->reset_at == 0;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	pfree(copy);
	return (Datum) 0;
}

/*
 * outbox.worker_status(): the relay's own view of itself, and the oldest
 * committer holding the frontier back (see the outbox.worker view).
 */
Datum
outbox_worker_status(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	OutboxWorkerStatus w;
	Datum		values[11];
	bool		nulls[11];
	char		held[OUTBOX_STATUS_LEN];
	TimestampTz held_at;
	pid_t		pid;
	OutboxStatsShared *st;
	OutboxDbInfo info;
	int			holder_pid;
	int64		holder_id;

	outbox_stats_check();
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "outbox: worker_status must return a record");
	desc = BlessTupleDesc(desc);
	if (!outbox_stats_here())
	{
		memset(nulls, true, sizeof(nulls));
		values[1] = CStringGetTextDatum("not served (outbox.databases)");
		nulls[1] = false;
		PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
	}

	st = outbox_my_stats();
	SpinLockAcquire(&st->mutex);
	if (st->dboid == MyDatabaseId)
		w = st->worker;
	else
		memset(&w, 0, sizeof(w));
	SpinLockRelease(&st->mutex);
	if (!outbox_db_info_of(MyDatabaseId, &info))
		info.note[0] = '\0';
	held_at = outbox_get_retention_status(held);
	pid = outbox_relay_running();
	outbox_oldest_in_flight(&holder_pid, &holder_id);

	memset(nulls, 0, sizeof(nulls));
	values[0] = Int32GetDatum((int32) pid);
	nulls[0] = pid == 0;
	values[1] = CStringGetTextDatum(pid != 0 ? w.state :
									info.note[0] != '\0' ? info.note : "stopped");
	values[2] = TimestampTzGetDatum(w.started_at);
	nulls[2] = pid == 0 || w.started_at == 0;
	values[3] = TimestampTzGetDatum(w.last_wakeup);
	nulls[3] = pid == 0 || w.last_wakeup == 0;
	values[4] = Int64GetDatum(w.read_position);
	nulls[4] = pid == 0;
	values[5] = Int64GetDatum(outbox_counter_valid() ? outbox_compute_frontier() : 0);
	nulls[5] = !outbox_counter_valid();
	values[6] = Int32GetDatum(holder_pid);
	nulls[6] = holder_pid == 0;
	values[7] = Int64GetDatum(holder_id);
	nulls[7] = holder_pid == 0;
	values[8] = Int32GetDatum(outbox_current_chunk());
	nulls[8] = outbox_current_chunk() == 0;
	values[9] = CStringGetTextDatum(held);
	nulls[9] = held[0] == '\0';
	values[10] = TimestampTzGetDatum(held_at);
	nulls[10] = held_at == 0;
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}

/*
 * outbox.reset_stats(): the relay zeroes its counters at its next turn,
 * before it delivers anything it read after this call (outbox.stats'
 * reset_at says when).
 */
Datum
outbox_reset_stats(PG_FUNCTION_ARGS)
{
	outbox_stats_check();
	if (!outbox_stats_here())
		PG_RETURN_VOID();
	pg_atomic_fetch_add_u64(&outbox_my_stats()->reset_generation, 1);
	outbox_wake_worker(false);
	PG_RETURN_VOID();
}

/*
 * outbox.relay_status() -> (datid, database, pid, state, started_at, last_error):
 * the relay of every database that has an outbox slot, read from any
 * database (EXECUTE is revoked from PUBLIC: it names every database).
 */
Datum
outbox_relays(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int			i;

	outbox_stats_check();
	InitMaterializedSRF(fcinfo, 0);
	for (i = 0; i < outbox_db_slots(); i++)
	{
		OutboxDbInfo info;
		OutboxWorkerStatus w;
		Datum		values[6];
		bool		nulls[6] = {0};
		char	   *name;
		bool		mine;

		if (!outbox_db_info(i, &info))
			continue;
		SpinLockAcquire(&StatsArray[i].mutex);
		mine = StatsArray[i].dboid == info.dboid;
		w = StatsArray[i].worker;
		SpinLockRelease(&StatsArray[i].mutex);
		name = get_database_name(info.dboid);
		values[0] = ObjectIdGetDatum(info.dboid);
		values[1] = name ? CStringGetTextDatum(name) : (Datum) 0;
		nulls[1] = name == NULL;
		values[2] = Int32GetDatum((int32) info.relay_pid);
		nulls[2] = info.relay_pid == 0;
		values[3] = CStringGetTextDatum(info.relay_pid != 0 ? (mine ? w.state : "starting") :
										info.note[0] != '\0' ? info.note : "stopped");
		values[4] = TimestampTzGetDatum(info.started_at);
		nulls[4] = info.relay_pid == 0 || info.started_at == 0;
		values[5] = CStringGetTextDatum(info.error);
		nulls[5] = info.error[0] == '\0';
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
