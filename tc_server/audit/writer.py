"""Incremental Parquet output for one snapshot table, shared by the exporter and the generator."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tc_server.audit.schema import part_file_name

# A new part file every this many rows: files of a few hundred MB split well across Spark tasks and
# stay small enough to copy around; nothing depends on the exact number.
DEFAULT_ROWS_PER_FILE = 20_000_000


class TableWriter:
    """Writes one table as ``<dir>/part-NNNNN.parquet`` files, one row group per :meth:`write` call.

    Memory is bounded by the largest batch passed in. An empty table still gets one (empty) file, so
    that readers find the schema.
    """

    def __init__(self, directory: Path, schema: pa.Schema, *, rows_per_file: int = DEFAULT_ROWS_PER_FILE):
        self._dir = directory
        self._schema = schema
        self._rows_per_file = rows_per_file
        self._writer: pq.ParquetWriter | None = None
        self._files = 0
        self._rows_in_file = 0
        self.rows = 0
        directory.mkdir(parents=True, exist_ok=True)

    def _open(self) -> pq.ParquetWriter:
        path = self._dir / part_file_name(self._files)
        self._files += 1
        self._rows_in_file = 0
        # zstd: ~2x smaller than snappy on these id/time columns at a similar read speed.
        return pq.ParquetWriter(path, self._schema, compression="zstd")

    def write(self, table: pa.Table) -> None:
        """Append ``table`` (cast to the schema; a type mismatch raises) as one row group."""
        if table.num_rows == 0:
            return
        if table.schema != self._schema:
            table = table.select(self._schema.names).cast(self._schema)
        if self._writer is None or self._rows_in_file >= self._rows_per_file:
            if self._writer is not None:
                self._writer.close()
            self._writer = self._open()
        self._writer.write_table(table, row_group_size=table.num_rows)
        self._rows_in_file += table.num_rows
        self.rows += table.num_rows

    def close(self) -> None:
        if self._writer is None:
            self._writer = self._open()
        self._writer.close()
