"""The audit's findings (docs/audit.md) as pure DataFrame transforms: DataFrames and parameters in, one
DataFrame out, no I/O, no actions. The job decides what to cache, write and count.

Times are epoch milliseconds throughout; ``now_ms`` is the snapshot's ``taken_at_ms`` unless the
operator says otherwise.

Op-based findings take the ops already joined to their headers (:func:`annotate_ops`): that join is
the one expensive step (every op against every header), so the job does it once and shares it.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from tc_server.audit.schema import KNOWN_STATES, TERMINAL_STATES

TXN_ID = ["txn_most", "txn_least"]
# An op record's identity: its key is /txn/op/<most>_<least>-<seq>.
OP_KEY = ["txn_most", "txn_least", "seq"]
OP_COLUMNS = [
    "txn_most", "txn_least", "seq", "kind", "segment", "subscription", "ledger_id", "entry_id", "created_ms"
]
# percentile_approx accuracy: relative error 1/10000, exact enough for a latency report and cheap
# at any size (an exact percentile sorts every row).
_PERCENTILE_ACCURACY = 10_000
LATENCY_PERCENTILES = (0.5, 0.9, 0.99, 0.999)
MINUTE_MS = 60_000


def _is_terminal(state: Column) -> Column:
    return state.isin(*TERMINAL_STATES)


def annotate_ops(headers: DataFrame, ops: DataFrame) -> DataFrame:
    """Every op with its header's presence, state and times (``h_*`` columns; null without a header).

    A shuffled hash join with the headers as the hash side: ops outnumber headers ~3:1, and not
    sorting them measured about 2x faster than Spark's default sort-merge join here."""
    h = headers.select(
        *TXN_ID,
        F.lit(True).alias("h_present"),
        F.col("state").alias("h_state"),
        F.col("created_ms").alias("h_created_ms"),
        F.col("finalized_ms").alias("h_finalized_ms"),
    )
    return ops.join(h.hint("shuffle_hash"), on=TXN_ID, how="left")


def ops_of_interest(annotated_ops: DataFrame, *, now_ms: int, gc_due_ms: int, skew_ms: int = 0) -> DataFrame:
    """The annotated ops any op-based finding can select: orphans, ops of OPEN txns, of GC-backlog
    txns, and late ops; a superset of what :func:`orphan_ops`, :func:`late_ops`,
    :func:`gc_backlog_ops` and :func:`pinning` keep. In a healthy store this is a small fraction
    of all ops, so the job keeps this instead of every op joined to its header."""
    h_state = F.col("h_state")
    return annotated_ops.where(
        F.col("h_present").isNull()
        | (h_state == "OPEN")
        | (_is_terminal(h_state) & (F.col("h_finalized_ms") < F.lit(now_ms - gc_due_ms)))
        | ((F.col("created_ms") > 0) & (F.col("created_ms") > F.col("h_finalized_ms") + F.lit(skew_ms)))
    )


# -- violations ---------------------------------------------------------------------------------


def open_past_deadline(headers: DataFrame, *, now_ms: int, grace_ms: int) -> DataFrame:
    """OPEN txns whose deadline passed more than ``grace_ms`` ago: the timeout sweep is behind
    (the coordinator aborts within 1 s of the deadline, docs/semantics.md §5)."""
    overdue = (F.col("state") == "OPEN") & (F.col("deadline_ms") + F.lit(grace_ms) < F.lit(now_ms))
    return headers.where(overdue).select(
        *TXN_ID,
        "coordinator_id",
        "created_ms",
        "timeout_ms",
        "deadline_ms",
        "owner",
        (F.lit(now_ms) - F.col("deadline_ms")).alias("overdue_ms"),
    )


def gc_backlog(headers: DataFrame, *, now_ms: int, gc_due_ms: int) -> DataFrame:
    """Terminal txns finalized longer than ``gc_due_ms`` ago (the retention, one GC interval and the
    grace: GC deletes a header on its first pass after the retention): GC should have removed them (or
    is waiting for their op records to go, see :func:`gc_backlog_ops`)."""
    return headers.where(
        _is_terminal(F.col("state")) & (F.col("finalized_ms") < F.lit(now_ms - gc_due_ms))
    ).select(
        *TXN_ID,
        "coordinator_id",
        "state",
        "created_ms",
        "finalized_ms",
        (F.lit(now_ms) - F.col("finalized_ms")).alias("age_ms"),
    )


def gc_backlog_ops(annotated_ops: DataFrame, *, now_ms: int, gc_due_ms: int) -> DataFrame:
    """Per segment, the op records of GC-backlog txns (what keeps GC from deleting their headers:
    docs/semantics.md §6 deletes a header only once no op records remain). Its violation count is the sum of
    ``op_records``."""
    return (
        annotated_ops.where(
            _is_terminal(F.col("h_state")) & (F.col("h_finalized_ms") < F.lit(now_ms - gc_due_ms))
        )
        .groupBy("segment")
        .agg(
            F.count(F.lit(1)).alias("op_records"),
            F.count_distinct(*TXN_ID).alias("txns"),
            F.min("h_finalized_ms").alias("oldest_finalized_ms"),
        )
        .withColumn("oldest_age_ms", F.lit(now_ms) - F.col("oldest_finalized_ms"))
    )


def orphan_ops(annotated_ops: DataFrame) -> DataFrame:
    """Op records whose txn has no header (written for an unknown txn, or left behind by a GC that
    deleted the header first)."""
    return annotated_ops.where(F.col("h_present").isNull()).select(*OP_COLUMNS)


def late_ops(annotated_ops: DataFrame, *, skew_ms: int = 0) -> DataFrame:
    """Op records the store created more than ``skew_ms`` after their txn was finalized: a participant
    kept writing for a decided txn. The create time is the store's clock, the finalization time the
    coordinator's; ``skew_ms`` is how far apart they may be. Ops with an unknown create time (0) cannot
    be judged and are skipped."""
    return annotated_ops.where(
        (F.col("created_ms") > 0)
        & F.col("h_finalized_ms").isNotNull()
        & (F.col("created_ms") > F.col("h_finalized_ms") + F.lit(skew_ms))
    ).select(
        *OP_COLUMNS,
        F.col("h_state").alias("state"),
        F.col("h_finalized_ms").alias("finalized_ms"),
        (F.col("created_ms") - F.col("h_finalized_ms")).alias("late_by_ms"),
    )


def id_reuse_risk(headers: DataFrame, tc_seq: DataFrame) -> DataFrame:
    """Headers whose id is at or above their coordinator's reserved ``next`` (or whose coordinator
    has no tc-seq record): a leader starting from ``next`` would hand the id out again (docs/semantics.md §1).
    The coordinator is the id's most bits (TxnId.mostSigBits = tcId), not the ``coordinator_id``
    column, which :func:`illegal_headers` checks separately."""
    seq = tc_seq.select(F.col("coordinator_id").alias("seq_coordinator"), F.col("next"))
    joined = headers.join(F.broadcast(seq), headers["txn_most"] == seq["seq_coordinator"], "left")
    return joined.where(F.col("next").isNull() | (F.col("txn_least") >= F.col("next"))).select(
        *TXN_ID,
        "coordinator_id",
        "state",
        "created_ms",
        "next",
        F.when(F.col("next").isNull(), F.lit("no_tc_seq"))
        .otherwise(F.lit("at_or_above_next"))
        .alias("reason"),
    )


def illegal_headers(headers: DataFrame) -> DataFrame:
    """Headers no correct coordinator writes, with every problem found in ``problems``."""
    state = F.col("state")
    finalized = F.col("finalized_ms")
    checks = [
        (~state.isin(*KNOWN_STATES), "unknown_state"),
        ((state == "OPEN") & finalized.isNotNull(), "open_with_finalized"),
        (_is_terminal(state) & finalized.isNull(), "terminal_without_finalized"),
        (finalized.isNotNull() & (finalized < F.col("created_ms")), "finalized_before_created"),
        (F.col("timeout_ms") <= 0, "non_positive_timeout"),
        (F.col("coordinator_id").cast("long") != F.col("txn_most"), "coordinator_id_mismatch"),
    ]
    problems = F.array_compact(F.array(*(F.when(cond, F.lit(name)) for cond, name in checks)))
    return (
        headers.withColumn("problems", problems)
        .where(F.size("problems") > 0)
        .select(*TXN_ID, "coordinator_id", "state", "created_ms", "timeout_ms", "finalized_ms", "problems")
    )


# -- informational ------------------------------------------------------------------------------


def undelivered_decisions(headers: DataFrame, participants: DataFrame, *, now_ms: int, grace_ms: int) -> DataFrame:
    """Decided txns whose participant records remain more than ``grace_ms`` after the decision: a
    broker of today was never told (docs/participants.md), so its partition's read horizon is pinned.
    Records without a header count too (GC keeps a header while they remain). One row per txn: its
    state and finalization time (null without a header), the participants left, one of their topics."""
    left = participants.groupBy(*TXN_ID).agg(
        F.count(F.lit(1)).alias("participants"), F.min("topic").alias("example_topic")
    )
    h = headers.select(*TXN_ID, "state", "finalized_ms")
    decided_before = F.coalesce(F.col("finalized_ms"), F.lit(0)) < F.lit(now_ms - grace_ms)
    return (
        left.join(h, on=TXN_ID, how="left")
        .where(F.col("state").isNull() | (_is_terminal(F.col("state")) & decided_before))
        .select(*TXN_ID, "state", "finalized_ms", "participants", "example_topic")
    )


DECIDED = ("COMMITTED", "ABORTED")  # the decisions an event may publish


def decision_mismatch(headers: DataFrame, events: DataFrame) -> DataFrame:
    """Txns whose published decisions disagree: with each other (two events of one txn with different
    decisions), or with their header (an event that says COMMITTED for a header that says ABORTED, or
    any decision for a header still OPEN). A Pulsar 5 participant applies the event it reads: a
    participant committed what the header calls aborted, or the other way round; and an event whose decision is
    neither COMMITTED nor ABORTED, which no participant can apply. One row per txn: the
    header's state (null without a header: GC may have collected it, which alone is no mismatch), the
    distinct decisions published, the events and one of their streams."""
    published = events.groupBy(*TXN_ID).agg(
        F.array_sort(F.collect_set("decision")).alias("decisions"),
        F.count(F.lit(1)).alias("events"),
        F.min("stream").alias("example_stream"),
    )
    h = headers.select(*TXN_ID, F.col("state").alias("header_state"))
    only = F.try_element_at("decisions", F.lit(1))  # the one decision, when there is one
    return (
        published.join(h, on=TXN_ID, how="left")
        .where((F.size("decisions") > 1)
               | (F.col("header_state").isNotNull() & (only != F.col("header_state")))
               | (F.col("header_state") == "OPEN")  # whatever the event says: no decision was taken
               | F.exists("decisions", lambda d: ~d.isin(*DECIDED)))  # no decision at all, header or not
        .select(*TXN_ID, "header_state", "decisions", "events", "example_stream")
    )


def pinning(annotated_ops: DataFrame, *, now_ms: int) -> DataFrame:
    """Per segment with ops of OPEN txns: the lowest (ledger_id, entry_id) they hold, which pins the
    segment's read horizon (readers cannot pass an undecided write), the txn holding it, and the
    oldest OPEN txn with ops there and its age. Not a violation: an open txn is normal."""
    open_ops = annotated_ops.where(F.col("h_state") == "OPEN")
    return (
        open_ops.groupBy("segment")
        .agg(
            F.min(F.struct("ledger_id", "entry_id", "txn_most", "txn_least")).alias("pin"),
            F.min(F.struct(F.col("h_created_ms").alias("created_ms"), *TXN_ID)).alias("oldest"),
            F.count_distinct(*TXN_ID).alias("open_txns"),
        )
        .select(
            "segment",
            "open_txns",
            F.col("pin.ledger_id").alias("pin_ledger_id"),
            F.col("pin.entry_id").alias("pin_entry_id"),
            F.col("pin.txn_most").alias("pin_txn_most"),
            F.col("pin.txn_least").alias("pin_txn_least"),
            F.col("oldest.txn_most").alias("oldest_txn_most"),
            F.col("oldest.txn_least").alias("oldest_txn_least"),
            F.col("oldest.created_ms").alias("oldest_created_ms"),
            (F.lit(now_ms) - F.col("oldest.created_ms")).alias("oldest_age_ms"),
        )
    )


def counts_by_state(headers: DataFrame) -> DataFrame:
    """Headers per (coordinator_id, state)."""
    return headers.groupBy("coordinator_id", "state").agg(F.count(F.lit(1)).alias("txns"))


def _latencies(headers: DataFrame) -> DataFrame:
    # Only headers that can have a latency; illegal ones (finalized before created) are reported
    # by illegal_headers and would only distort the distribution.
    return headers.where(
        _is_terminal(F.col("state"))
        & F.col("finalized_ms").isNotNull()
        & (F.col("finalized_ms") >= F.col("created_ms"))
    ).select("state", (F.col("finalized_ms") - F.col("created_ms")).alias("latency_ms"))


def latency_percentiles(headers: DataFrame) -> DataFrame:
    """Per terminal state: count, approximate p50/p90/p99/p99.9 and max of finalized - created (ms)."""
    pct = F.percentile_approx("latency_ms", list(LATENCY_PERCENTILES), _PERCENTILE_ACCURACY)
    return (
        _latencies(headers)
        .groupBy("state")
        .agg(F.count(F.lit(1)).alias("txns"), pct.alias("pct"), F.max("latency_ms").alias("max_ms"))
        .select(
            "state",
            "txns",
            *(F.col("pct")[i].alias(percentile_column(p)) for i, p in enumerate(LATENCY_PERCENTILES)),
            "max_ms",
        )
    )


def percentile_column(p: float) -> str:
    """0.5 → p50_ms, 0.999 → p99_9_ms."""
    return "p" + f"{p * 100:g}".replace(".", "_") + "_ms"


def latency_histogram(headers: DataFrame) -> DataFrame:
    """Per terminal state, txns per power-of-two latency bucket ``[lower_ms, upper_ms)``
    (bucket 0 is [0, 1) ms)."""
    bucket = F.when(F.col("latency_ms") < 1, F.lit(0)).otherwise(
        F.floor(F.log2(F.col("latency_ms").cast("double"))).cast("int") + 1
    )
    return (
        _latencies(headers)
        .withColumn("bucket", bucket)
        .groupBy("state", "bucket")
        .agg(F.count(F.lit(1)).alias("txns"))
        .withColumn(
            "lower_ms",
            F.when(F.col("bucket") == 0, F.lit(0))
            .otherwise(F.pow(F.lit(2), F.col("bucket") - 1))
            .cast("long"),
        )
        .withColumn("upper_ms", F.pow(F.lit(2), F.col("bucket")).cast("long"))
    )


def throughput(headers: DataFrame) -> DataFrame:
    """Per minute (``minute_ms``, the minute's start): txns created, committed and aborted."""
    created = (
        headers.select((F.floor(F.col("created_ms") / MINUTE_MS) * MINUTE_MS).cast("long").alias("minute_ms"))
        .groupBy("minute_ms")
        .agg(F.count(F.lit(1)).alias("created"))
    )
    finalized = (
        headers.where(_is_terminal(F.col("state")) & F.col("finalized_ms").isNotNull())
        .select(
            (F.floor(F.col("finalized_ms") / MINUTE_MS) * MINUTE_MS).cast("long").alias("minute_ms"),
            "state",
        )
        .groupBy("minute_ms")
        .agg(
            F.sum(F.when(F.col("state") == "COMMITTED", 1).otherwise(0)).cast("long").alias("committed"),
            F.sum(F.when(F.col("state") == "ABORTED", 1).otherwise(0)).cast("long").alias("aborted"),
        )
    )
    return created.join(finalized, on="minute_ms", how="full_outer").na.fill(0).orderBy("minute_ms")
