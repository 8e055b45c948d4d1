"""The audit job: read a snapshot, compute every finding, write Parquet tables, summary.json and
report.html, and exit 0 (clean), 1 (violations), 2 (bad input) or 3 (the job itself failed).

Runs as ``tc-audit``, ``python -m tc_server.audit`` or ``spark-submit tc_server/audit/job.py``
(then ``--master`` and ``--driver-memory`` belong to spark-submit). All the work is DataFrame
operations in the JVM (no Python UDFs), so a cluster's executors need no Python packages.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

if __package__ in (None, ""):
    # Run as a file (spark-submit tc_server/audit/job.py): make the package importable from the
    # checkout this file sits in, as `python -m` would.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tc_server.audit import findings as fx  # noqa: E402
from tc_server.audit import report  # noqa: E402
from tc_server.audit.schema import (  # noqa: E402
    ARROW_SCHEMAS,
    EVENTS,
    FORMAT_NAME,
    FORMAT_VERSION,
    KNOWN_STATES,
    MAX_TIME_MS,
    OPTIONAL_TABLES,
    PARTICIPANTS,
    REJECTS_JSONL,
    SNAPSHOT_JSON,
    TABLES,
    TIME_COLUMNS,
    VIOLATIONS,
    spark_schema,
)

EXIT_OK = 0
EXIT_VIOLATIONS = 1
EXIT_BAD_INPUT = 2
EXIT_FAILED = 3

DEFAULT_RETENTION_S = 900  # the coordinator's GC retention (docs/semantics.md §6)
DEFAULT_GC_INTERVAL_S = 300  # the coordinator's --gc-interval-s: GC deletes on its first pass after retention
DEFAULT_GRACE_S = 60  # Pulsar's own sweep runs every 60 s; later than that is "behind"
# An op's create time is the store's clock (Oxia's shard leader), its txn's finalization time the
# coordinator's: an op written a moment before the commit can look later by the skew between them.
DEFAULT_CLOCK_SKEW_MS = 1000
INFO_TABLES = ("pinning", "counts_by_state", "latency_percentiles", "latency_histogram", "throughput")
_SAMPLE_ROWS = 20
_BROADCAST_MAX_ROWS = 4_000_000
_PINNING_ROWS = 20


class BadInputError(Exception):
    """The input is not a readable snapshot; the message names the file and the problem."""


@dataclass(frozen=True)
class AuditParams:
    now_ms: int | None = None  # None: the snapshot's taken_at_ms
    retention_s: int = DEFAULT_RETENTION_S
    gc_interval_s: int = DEFAULT_GC_INTERVAL_S
    grace_s: int = DEFAULT_GRACE_S
    clock_skew_ms: int = DEFAULT_CLOCK_SKEW_MS


# -- input validation ---------------------------------------------------------------------------


def _local_path(location: str) -> Path | None:
    """The local path of ``location``, or None for a URI of another file system (hdfs://, s3a://)."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else location)
    if len(parsed.scheme) == 1:  # a Windows drive letter
        return Path(location)
    return None


def check_snapshot_doc(doc: Any, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise BadInputError(f"{where}: not a JSON object")
    if doc.get("format") != FORMAT_NAME:
        raise BadInputError(f"{where}: format is {doc.get('format')!r}, expected {FORMAT_NAME!r}")
    if doc.get("format_version") != FORMAT_VERSION:
        raise BadInputError(
            f"{where}: format_version {doc.get('format_version')!r} is not supported "
            f"(this job reads {FORMAT_VERSION})"
        )
    taken = doc.get("taken_at_ms")
    if isinstance(taken, bool) or not isinstance(taken, int):
        raise BadInputError(f"{where}: taken_at_ms is not an integer: {taken!r}")
    if not 0 <= taken <= MAX_TIME_MS:  # found only by the report, after the whole job, as exit 3
        raise BadInputError(f"{where}: taken_at_ms {taken} is out of range (0 to year 9999)")
    _export_rejects(doc)
    return doc


def _check_arrow_schema(table: str, file: Path, actual: Any) -> None:
    expected = ARROW_SCHEMAS[table]
    for f in expected:
        idx = actual.get_field_index(f.name)
        if idx < 0:
            raise BadInputError(f"{file}: missing column {f.name!r} ({f.type}) of table {table!r}")
        got = actual.field(idx).type
        if got != f.type:
            raise BadInputError(f"{file}: column {f.name!r} has type {got}, expected {f.type}")


def validate_local_snapshot(root: Path) -> dict[str, Any]:
    """Check a snapshot directory without Spark: snapshot.json, each table's directory and every
    Parquet footer (schema). Returns snapshot.json's content. Raises :class:`BadInputError`."""
    # pyarrow reads only footers here; imported lazily so a driver without it can still run the job
    # (then the Spark-side checks in :func:`_read_table` are all there is).
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not root.exists():
        raise BadInputError(f"{root}: no such snapshot directory")
    if not root.is_dir():
        raise BadInputError(f"{root}: not a directory")
    meta = root / SNAPSHOT_JSON
    if not meta.is_file():
        raise BadInputError(f"{meta}: missing (not a snapshot, or an export that did not finish)")
    try:
        doc = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BadInputError(f"{meta}: not valid JSON: {type(exc).__name__}: {str(exc)[:200]}") from exc
    checked = check_snapshot_doc(doc, str(meta))
    for table in (*TABLES, *OPTIONAL_TABLES):
        directory = root / table
        declared = _declared_rows(checked, table)
        if table in OPTIONAL_TABLES and not directory.exists():
            if declared:
                raise BadInputError(f"{directory}: missing table {table!r}, which {SNAPSHOT_JSON} says has "
                                    f"{declared} rows (a partial copy of the snapshot?)")
            continue
        if not directory.is_dir():
            raise BadInputError(f"{directory}: missing table {table!r}")
        # Spark skips names starting with "." or "_" (_SUCCESS, .crc); so does this check.
        files = sorted(
            p for p in directory.iterdir() if p.suffix == ".parquet" and not p.name.startswith((".", "_"))
        )
        if not files:
            raise BadInputError(f"{directory}: table {table!r} has no .parquet files")
        rows = 0
        for file in files:
            try:
                footer = pq.read_metadata(file)
                schema = footer.schema.to_arrow_schema()
            except (pa.ArrowException, OSError) as exc:
                raise BadInputError(f"{file}: not a readable Parquet file: {exc}") from exc
            _check_arrow_schema(table, file, schema)
            rows += footer.num_rows
        # A part file lost in a copy left the audit judging the rows that remained, silently: what it missed
        # (an overdue txn, an undelivered decision) was simply not there.
        if declared is not None and rows != declared:
            raise BadInputError(f"{directory}: table {table!r} has {rows} rows where {SNAPSHOT_JSON} says "
                                f"{declared} (a part file missing or extra: a partial copy of the snapshot?)")
    return checked


def _declared_rows(snapshot: dict[str, Any], table: str) -> int | None:
    """The rows snapshot.json says ``table`` has (row_counts, or optional_tables for an optional one), or None
    when it says nothing of them."""
    if table in OPTIONAL_TABLES:
        entry = (snapshot.get("optional_tables") or {}).get(table)
        rows = entry.get("rows") if isinstance(entry, dict) else None
    else:
        rows = (snapshot.get("row_counts") or {}).get(table)
    return rows if isinstance(rows, int) and not isinstance(rows, bool) else None


def check_values(table: str, df: Any, location: str) -> None:
    """Nulls where the contract has none, and times outside [0, MAX_TIME_MS], in one aggregation over the
    table. Before, a header with a null state passed every finding's predicate unseen (the audit said "no
    violations"), and one time near int64's end overflowed the job's arithmetic under ANSI mode (exit 3,
    over one row). The ops' text columns are left out: reading every segment name again would cost more
    than any finding a null there could hide (the pinning chart shows it as a segment of its own)."""
    from pyspark.sql import functions as F

    fields = ARROW_SCHEMAS[table]
    required = [f.name for f in fields if not f.nullable and (table != "ops" or str(f.type) != "string")]
    checks = [F.sum(F.col(name).isNull().cast("long")).alias(f"null__{name}") for name in required]
    checks += [F.sum((~F.col(name).between(0, MAX_TIME_MS)).cast("long")).alias(f"range__{name}")
               for name in TIME_COLUMNS.get(table, ())]
    if not checks:
        return
    counts = df.agg(*checks).first().asDict()
    problems = [f"{count} null in column {key[len('null__'):]!r}" for key, count in counts.items()
                if key.startswith("null__") and count]
    problems += [f"{count} outside 0 to year 9999 in column {key[len('range__'):]!r}" for key, count in counts.items()
                 if key.startswith("range__") and count]
    if problems:
        raise BadInputError(f"{location}: table {table!r} has values the snapshot format does not allow: "
                            f"{'; '.join(problems)}")


def _read_remote_snapshot_doc(spark: Any, root: str) -> dict[str, Any]:
    where = f"{root.rstrip('/')}/{SNAPSHOT_JSON}"
    try:
        # text()'s own wholetext=False would switch the option off: snapshot.json is indented, and its first
        # line alone ("{") is no JSON (every snapshot on hdfs:// or s3a:// was refused).
        rows = spark.read.text(where, wholetext=True).collect()
        doc = json.loads(rows[0][0])
    except Exception as exc:  # noqa: BLE001 - any failure here means the snapshot is unusable
        raise BadInputError(f"{where}: cannot read: {str(exc).splitlines()[0]}") from exc
    checked: dict[str, Any] = check_snapshot_doc(doc, where)
    return checked


def _read_optional_table(spark: Any, root: str, table: str, *, validated: bool) -> Any:
    """An optional table (schema.OPTIONAL_TABLES), empty when the snapshot has none."""
    local = _local_path(root)
    if local is not None and not (local / table).exists():
        return spark.createDataFrame([], spark_schema(table))
    if local is None:
        try:
            _ = spark.read.parquet(f"{root.rstrip('/')}/{table}").schema
        except Exception as exc:  # noqa: BLE001 - AnalysisException [PATH_NOT_FOUND]: an older snapshot
            if "PATH_NOT_FOUND" not in str(exc) and "Path does not exist" not in str(exc):
                # A table that is there and cannot be read is damaged, not absent: read as none, its
                # findings (undelivered decisions) were silently zero.
                raise BadInputError(f"{root.rstrip('/')}/{table}: cannot read: {str(exc).splitlines()[0]}") from exc
            return spark.createDataFrame([], spark_schema(table))
    return _read_table(spark, root, table, validated=validated)


def _read_table(spark: Any, root: str, table: str, *, validated: bool) -> Any:
    location = f"{root.rstrip('/')}/{table}"
    schema = spark_schema(table)
    if not validated:
        # Remote input: let Spark read the footers and compare, since pyarrow could not.
        try:
            actual = spark.read.parquet(location).schema
        except Exception as exc:  # noqa: BLE001 - AnalysisException, SparkException: all bad input
            reason = str(exc).splitlines()[0]
            raise BadInputError(f"{location}: cannot read table {table!r}: {reason}") from exc
        have = {f.name: f.dataType for f in actual.fields}
        for f in schema.fields:
            if f.name not in have:
                raise BadInputError(f"{location}: missing column {f.name!r} of table {table!r}")
            if have[f.name] != f.dataType:
                raise BadInputError(
                    f"{location}: column {f.name!r} has type {have[f.name].simpleString()}, "
                    f"expected {f.dataType.simpleString()}"
                )
    # The explicit schema, not inference: the contract is schema.py, and extra columns are dropped.
    return spark.read.schema(schema).parquet(location)


# -- Spark session ------------------------------------------------------------------------------


def default_driver_memory() -> str:
    """A quarter of the machine's memory, 1..8 GiB: local mode runs every task in the driver JVM."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return "2g"
    gib = max(1, min(8, total // 4 // 2**30))
    return f"{gib}g"


def spark_session(
    master: str | None = None, driver_memory: str | None = None, *, verbose: bool = False
) -> tuple[Any, bool]:
    """The active session if there is one (a test's, spark-submit's), else a new one; and whether
    this call created it (then the caller stops it)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    builder = SparkSession.builder.appName("tc-audit")
    # Under spark-submit the JVM exists already and --master came with it; otherwise local[*].
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    if master or not submitted:
        builder = builder.master(master or "local[*]")
    if not submitted:
        builder = builder.config("spark.driver.memory", driver_memory or default_driver_memory())
    builder = (
        builder.config("spark.ui.enabled", "false")
        # The stage progress bar would interleave \r lines with our output.
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.parquet.compression.codec", "zstd")
        # Py4J errors carry Spark's message without the JVM stack trace (it goes nowhere useful).
        .config("spark.sql.pyspark.jvmStacktrace.enabled", "false")
    )
    spark = builder.getOrCreate()
    # The job reports failures itself, in one line; Spark's own ERROR lines are multi-page Java stack
    # traces of the same failure (on stderr). --verbose brings them back.
    spark.sparkContext.setLogLevel("WARN" if verbose else "FATAL")
    configure_for_master(spark)
    return spark, True


def configure_for_master(spark: Any) -> None:
    if spark.sparkContext.master.startswith("local"):
        # The default 200 shuffle partitions are 200 tiny tasks per stage on a laptop; a few per
        # core keep every core busy and AQE coalesces what is left.
        partitions = max(4, 4 * (os.cpu_count() or 1))
        spark.conf.set("spark.sql.shuffle.partitions", str(partitions))


# -- the job ------------------------------------------------------------------------------------


def _ops_of_interest(headers: Any, ops: Any, *, now_ms: int, gc_due_ms: int, skew_ms: int = 0) -> Any:
    """``findings.ops_of_interest(findings.annotate_ops(headers, ops))``, computed in two passes and
    persisted (memory, spilling to disk).

    Joining every op to its header is the one expensive step: every op is shuffled. Shuffling the
    op's key and create time only, then fetching the full rows of the few ops that matter (a few
    percent in a healthy store) by a broadcast join, measured ~3x faster than joining whole ops,
    whose segment strings dominate the shuffle. Caching all joined ops, or the headers, measured
    slower than re-reading the few Parquet columns each later step needs."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    narrow_ops = ops.select(*fx.OP_KEY, "created_ms")
    keys = (
        fx.ops_of_interest(fx.annotate_ops(headers, narrow_ops), now_ms=now_ms, gc_due_ms=gc_due_ms,
                           skew_ms=skew_ms)
        .drop("created_ms")
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    # Broadcast only what fits comfortably in every executor (~60 bytes a row); an unhealthy store
    # with more falls back to a shuffle join: slower, same result.
    small = F.broadcast(keys) if keys.count() <= _BROADCAST_MAX_ROWS else keys
    annotated = ops.join(small, on=fx.OP_KEY, how="inner").persist(StorageLevel.MEMORY_AND_DISK)
    annotated.count()
    keys.unpersist()
    return annotated


def _rows(df: Any, limit: int | None = None) -> list[dict[str, Any]]:
    if limit is not None:
        df = df.limit(limit)
    return [row.asDict(recursive=True) for row in df.collect()]


def run_audit(
    spark: Any, input_dir: str, output_dir: str, params: AuditParams = AuditParams()
) -> dict[str, Any]:
    """Audit the snapshot at ``input_dir`` into ``output_dir``; returns the summary (also written as
    summary.json). Raises :class:`BadInputError` for an unusable snapshot."""
    started = time.monotonic()
    local_in = _local_path(input_dir)
    if local_in is not None:
        doc = validate_local_snapshot(local_in)
    else:
        doc = _read_remote_snapshot_doc(spark, input_dir)
    now_ms = params.now_ms if params.now_ms is not None else int(doc["taken_at_ms"])
    grace_ms = params.grace_s * 1000
    # A terminal header is GC's to delete on its first pass after the retention: judged only once a
    # whole GC interval (and the grace) has passed too, or every store with traffic shows a backlog.
    gc_due_ms = (params.retention_s + params.gc_interval_s + params.grace_s) * 1000

    if not 0 <= now_ms <= MAX_TIME_MS:
        raise BadInputError(f"now_ms {now_ms} is out of range (0 to year 9999)")
    validated = local_in is not None
    headers, ops, tc_seq = (_read_table(spark, input_dir, t, validated=validated) for t in TABLES)
    participants = _read_optional_table(spark, input_dir, PARTICIPANTS, validated=validated)
    events = _read_optional_table(spark, input_dir, EVENTS, validated=validated)
    for table, df in zip((*TABLES, PARTICIPANTS, EVENTS), (headers, ops, tc_seq, participants, events), strict=True):
        check_values(table, df, f"{input_dir.rstrip('/')}/{table}")
    out = output_dir.rstrip("/")
    # Seconds per step, in the summary: where the time goes is the first question about a slow audit.
    timings: dict[str, float] = {}
    mark = time.monotonic()
    annotated = _ops_of_interest(headers, ops, now_ms=now_ms, gc_due_ms=gc_due_ms, skew_ms=params.clock_skew_ms)
    timings["ops_join"] = round(time.monotonic() - mark, 3)

    def write(name: str, df: Any) -> Any:
        mark = time.monotonic()
        df.write.mode("overwrite").parquet(f"{out}/{name}")
        timings[name] = round(time.monotonic() - mark, 3)
        return spark.read.parquet(f"{out}/{name}")

    tables = {
        "open_past_deadline": fx.open_past_deadline(headers, now_ms=now_ms, grace_ms=grace_ms),
        "gc_backlog": fx.gc_backlog(headers, now_ms=now_ms, gc_due_ms=gc_due_ms),
        "gc_backlog_ops": fx.gc_backlog_ops(annotated, now_ms=now_ms, gc_due_ms=gc_due_ms),
        "orphan_ops": fx.orphan_ops(annotated),
        "late_ops": fx.late_ops(annotated, skew_ms=params.clock_skew_ms),
        "id_reuse_risk": fx.id_reuse_risk(headers, tc_seq),
        "illegal_headers": fx.illegal_headers(headers),
        "undelivered_decisions": fx.undelivered_decisions(headers, participants, now_ms=now_ms, grace_ms=grace_ms),
        "decision_mismatch": fx.decision_mismatch(headers, events),
    }
    violations: dict[str, int] = {}
    samples: dict[str, list[dict[str, Any]]] = {}
    for name, df in tables.items():
        written = write(name, df)
        if name == "gc_backlog_ops":
            # Counted in op records, not segments: each one is a record GC is waiting for.
            total = written.agg({"op_records": "sum"}).collect()[0][0]
            violations[name] = int(total or 0)
        else:
            violations[name] = written.count()
        # Ordered (Spark's top-N, no full sort): the same snapshot shows the same examples in every run.
        samples[name] = _rows(written.orderBy(*written.columns), _SAMPLE_ROWS) if violations[name] else []

    from pyspark.sql import functions as F

    pinning = write("pinning", fx.pinning(annotated, now_ms=now_ms))
    by_state = write("counts_by_state", fx.counts_by_state(headers).coalesce(1))
    latency = write("latency_percentiles", fx.latency_percentiles(headers).coalesce(1))
    histogram = write("latency_histogram", fx.latency_histogram(headers).coalesce(1))
    throughput = write("throughput", fx.throughput(headers).coalesce(1))

    state_rows = [(int(r["coordinator_id"]), str(r["state"]), int(r["txns"])) for r in _rows(by_state)]
    counts_by_state = dict.fromkeys(KNOWN_STATES, 0)
    counts_by_coordinator: dict[str, dict[str, int]] = {}
    for coordinator, state, n in sorted(state_rows):
        counts_by_state[state] = counts_by_state.get(state, 0) + n
        counts_by_coordinator.setdefault(str(coordinator), {})[state] = n
    latency_ms = {
        str(r["state"]): {k: (int(v) if v is not None else None) for k, v in r.items() if k != "state"}
        for r in _rows(latency.orderBy("state"))
    }
    pinning_top = _rows(pinning.orderBy(F.desc("oldest_age_ms"), "segment"), _PINNING_ROWS)
    pinning_stats = pinning.agg(F.count(F.lit(1)), F.max("oldest_age_ms")).collect()[0]
    total_txns = sum(n for _, _, n in state_rows)
    total_ops = ops.count()

    snapshot = {
        "path": input_dir,
        "source": doc.get("source"),
        "taken_at_ms": doc["taken_at_ms"],
        "format_version": doc["format_version"],
        "row_counts": doc.get("row_counts"),
    }
    if "generator" in doc:
        snapshot["generator"] = doc["generator"]
    summary: dict[str, Any] = {
        "snapshot": snapshot,
        "params": {
            "now_ms": now_ms,
            "now_from": "--now-ms" if params.now_ms is not None else "snapshot taken_at_ms",
            "retention_s": params.retention_s,
            "gc_interval_s": params.gc_interval_s,
            "grace_s": params.grace_s,
            "clock_skew_ms": params.clock_skew_ms,
            "master": spark.sparkContext.master,
        },
        "total_txns": total_txns,
        "total_ops": total_ops,
        "counts_by_state": counts_by_state,
        "counts_by_coordinator": counts_by_coordinator,
        "violations": {name: violations[name] for name in VIOLATIONS},
        "violation_total": sum(violations.values()),
        "latency_ms": latency_ms,
        "pinning": {"segments": int(pinning_stats[0]), "oldest_age_ms": pinning_stats[1]},
        "export_rejects": _export_rejects(doc),
        "rejects_file": REJECTS_JSONL if local_in and (local_in / REJECTS_JSONL).exists() else None,
        "tables": {name: f"{name}/" for name in (*VIOLATIONS, *INFO_TABLES)},
        "duration_s": None,
        "timings_s": timings,
    }
    data = report.ReportData(
        summary=summary,
        state_by_coordinator=state_rows,
        latency_histogram=[
            (str(r["state"]), int(r["lower_ms"]), int(r["upper_ms"]), int(r["txns"]))
            for r in _rows(histogram)
        ],
        throughput=[
            (int(r["minute_ms"]), int(r["created"]), int(r["committed"]), int(r["aborted"]))
            for r in _rows(throughput)
        ],
        pinning=pinning_top,
        samples=samples,
    )
    annotated.unpersist()
    summary["duration_s"] = round(time.monotonic() - started, 3)
    _write_text(spark, out, "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
    _write_text(spark, out, "report.html", report.render(data))
    return summary


def _write_text(spark: Any, out: str, name: str, text: str) -> None:
    local = _local_path(out)
    if local is not None:
        local.mkdir(parents=True, exist_ok=True)
        tmp = local / (name + ".tmp")
        tmp.write_text(text, encoding="utf-8")  # the report says charset=utf-8, whatever the locale
        tmp.replace(local / name)
        return
    # A cluster file system: write through Hadoop's FileSystem, as the Parquet tables were.
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(f"{out}/{name}")
    stream = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).create(path, True)
    try:
        stream.write(bytearray(text.encode()))
    finally:
        stream.close()


# Spark's error class for a file it could not read (corrupt pages behind a valid footer, a file
# truncated while the job ran): that is bad input, not a failed job.
_FAILED_READ = re.compile(r"\[FAILED_READ_FILE[A-Z_.]*\][^\n]*?reading file (\S+?)\.?(?:\s|$)")
_CAUSE = re.compile(r"^Caused by: (.+)$", re.MULTILINE)


def bad_input_from_spark(exc: BaseException) -> str | None:
    """The file and the reason when ``exc`` is Spark failing to read an input file, else None."""
    text = str(exc)
    java = getattr(exc, "java_exception", None)
    if java is not None:
        # The JVM may be gone by now; the Python-side text is enough then.
        with contextlib.suppress(Exception):
            text += "\n" + str(java.toString())
    found = _FAILED_READ.search(text)
    if not found:
        return None
    causes = _CAUSE.findall(text)
    reason = causes[0] if causes else "unreadable Parquet data"
    return f"{found.group(1)}: not readable: {reason}"


# -- command line -------------------------------------------------------------------------------


def build_parser(prog: str = "tc-audit") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Audit a tc-server transaction snapshot. Exit 0: clean; 1: violations; 2: bad input; "
        "3: the job failed.",
    )
    parser.add_argument("--input", required=True, help="snapshot directory (export or generate output)")
    parser.add_argument("--output", required=True, help="directory for the tables, summary.json, report.html")
    parser.add_argument("--master", default=None, help="Spark master URL (default local[*])")
    parser.add_argument(
        "--driver-memory", default=None, help="when the job starts Spark itself (default: auto)"
    )
    parser.add_argument(
        "--now-ms", type=int, default=None, help="audit as of this time (default: the snapshot's time)"
    )
    parser.add_argument("--retention-s", type=int, default=DEFAULT_RETENTION_S, help="GC retention (900)")
    parser.add_argument("--gc-interval-s", type=int, default=DEFAULT_GC_INTERVAL_S,
                        help="the coordinator's GC interval (300)")
    parser.add_argument("--grace-s", type=int, default=DEFAULT_GRACE_S, help="timeout sweep grace (60)")
    parser.add_argument("--clock-skew-ms", type=int, default=DEFAULT_CLOCK_SKEW_MS,
                        help="an op is late only this much after its txn's finalization: the two times come "
                             "from the store's clock and the coordinator's (1000)")
    parser.add_argument("--verbose", action="store_true", help="Spark's warnings and full tracebacks on failure")
    return parser


# The largest threshold taken, in seconds (~100 years): every time plus it fits a long in milliseconds.
MAX_THRESHOLD_S = 100 * 366 * 86_400


def main(argv: list[str] | None = None, prog: str = "tc-audit") -> int:
    args = build_parser(prog).parse_args(argv)
    seconds = (args.retention_s, args.grace_s, args.gc_interval_s)
    if min(*seconds, args.clock_skew_ms) < 0 or max(seconds) > MAX_THRESHOLD_S \
            or args.clock_skew_ms > MAX_THRESHOLD_S * 1000:
        # Above: a time plus the threshold must stay a long in milliseconds (Spark failed, exit 3).
        print(f"{prog}: --retention-s, --gc-interval-s and --grace-s must be between 0 and {MAX_THRESHOLD_S} "
              f"(~100 years), --clock-skew-ms between 0 and {MAX_THRESHOLD_S * 1000}", file=sys.stderr)
        return EXIT_BAD_INPUT
    params = AuditParams(now_ms=args.now_ms, retention_s=args.retention_s, gc_interval_s=args.gc_interval_s,
                         grace_s=args.grace_s, clock_skew_ms=args.clock_skew_ms)
    local_in = _local_path(args.input)
    spark = None
    owned = False
    try:
        if local_in is not None:
            # Fail fast on a bad snapshot, before paying for a JVM.
            validate_local_snapshot(local_in)
        spark, owned = spark_session(args.master, args.driver_memory, verbose=args.verbose)
        summary = run_audit(spark, args.input, args.output, params)
    except BadInputError as exc:
        print(f"{prog}: bad input: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # noqa: BLE001 - one line on stderr instead of a Py4J dump, exit 3
        unreadable = bad_input_from_spark(exc)
        if unreadable:
            print(f"{prog}: bad input: {unreadable}", file=sys.stderr)
            return EXIT_BAD_INPUT
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"{prog}: audit failed: {type(exc).__name__}: {first}", file=sys.stderr)
        if args.verbose:
            traceback.print_exc()
        return EXIT_FAILED
    finally:
        if spark is not None and owned:
            spark.stop()
    code, line = outcome(summary)
    print(line + f"; report: {args.output.rstrip('/')}/report.html")
    return code


def _export_rejects(snapshot: dict[str, Any]) -> int:
    """Records the export could not read, in every table (participant records are an optional table)."""
    counted = 0
    optional = snapshot.get("optional_tables") or {}
    if not isinstance(optional, dict):
        raise BadInputError(f"{SNAPSHOT_JSON}: optional_tables is not an object: {str(optional)[:100]}")
    for rejects in (snapshot.get("rejects"), *(table.get("rejects") for table in optional.values()
                                               if isinstance(table, dict))):
        values = list(rejects.values()) if isinstance(rejects, dict) else [] if rejects is None else [rejects]
        for value in values:
            # Checked with snapshot.json (check_snapshot_doc): int() of a string crashed the job after the whole
            # run, and a negative count cancelled real rejects out.
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise BadInputError(f"{SNAPSHOT_JSON}: a rejects count is not a non-negative integer: {value!r}")
            counted += value
    return counted


def outcome(summary: dict[str, Any]) -> tuple[int, str]:
    """The exit code and one line for a finished audit. Records the export could not read fail it like a
    violation: they were not audited (a damaged header is skipped by the coordinator's scans as well, and
    a damaged participant record is never told its decision), so "no violations" would not be true."""
    found = {k: v for k, v in summary["violations"].items() if v}
    rejects = int(summary.get("export_rejects") or 0)
    text = (f"audited {summary['total_txns']:,} txns and {summary['total_ops']:,} ops in {summary['duration_s']} s; "
            + (", ".join(f"{k}={v:,}" for k, v in found.items()) if found else "no violations"))
    if rejects:
        text += f"; {rejects:,} records the export could not read (its {REJECTS_JSONL}) were not audited"
    return (EXIT_VIOLATIONS if found or rejects else EXIT_OK), text


if __name__ == "__main__":
    sys.exit(main(prog="job.py"))
