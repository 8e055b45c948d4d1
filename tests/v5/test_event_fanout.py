"""PIP-473 records: the decision events tc-server writes for the op records Pulsar 5's participants
wrote, against Pulsar's own TxnPaths / TxnMetadataStore (5.0.0-M1 jars) as the oracle.

Upstream facts relied on (apache/pulsar, pulsar-broker):

* ``.../transaction/metadata/TxnMetadataStore.java`` ``appendOp``: an op record goes under
  ``TxnPaths.opParent(txnId)`` as a sequential put, partition key = txnId, with index entries
  ``idx:ops-by-txn`` = txnId and ``idx:writes-by-segment`` = ``segmentKey(segment)`` (WRITE) or
  ``idx:acks-by-segment-subscription`` = ``ackIndexKey(segment, subscription)`` (ACK); Pulsar's Oxia store
  prefixes each secondary key with the parent path ``/txn/op/``.
* ``.../coordinator/v5/TransactionCoordinatorV5.java`` ``fanOutEvents``: one event per distinct WRITE segment
  and one per distinct (segment, subscription) of an ACK whose subscription is not null;
  ``publishSegmentEvent`` puts ``toJson(new TxnEvent(txnId, decision))`` sequentially under
  ``segmentEventsParent(segment)`` with partition key ``segmentKey(segment)``; ``publishSubscriptionEvent``
  under ``subscriptionEventsParent(segment, sub)`` with partition key ``ackIndexKey(segment, sub)``.
"""

from __future__ import annotations

from pathlib import Path

from tc_server.coordinator import layout
from tc_server.coordinator.coordinator import CoordinatorConfig, TransactionCoordinator
from tc_server.coordinator.layout import OpKind, TxnOp
from tc_server.coordinator.partition import PartitionConfig
from tc_server.metrics import Metrics
from tc_server.store.api import Put
from tc_server.store.memory import MemoryStore
from tests.v5.java_oracle import JAVA_DECODE, run_java, utf16_hex

SEGMENTS = [
    "segment://public/default/orders/0",
    "segment://t/ns/\u00e9\u4e2d\U0001F600/3",
    "segment://t/ns/a b+c%d~e*f:g;h?i#j&k=l/1",
    "segment://t/ns/" + "x" * 3000 + "/0",
    "segment://t/ns/lone\ud800/0",
    "segment://t/ns/ctl\t\n\u007f\u0080/0",
]
SUBSCRIPTIONS = ["my sub", "a:b", "a/b", "\u00fc", "\U0001F600", "%41", "a+b~c*d", "x" * 2000]


class FakeClock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class RecordingStore(MemoryStore):
    """Memory store that keeps every batched Put (events go through write_batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.puts: list[Put] = []

    async def write_batch(self, ops):
        self.puts.extend(op for op in ops if isinstance(op, Put))
        return await super().write_batch(ops)


async def _append_op(store: MemoryStore, most: int, least: int, op: TxnOp) -> None:
    """As Pulsar's TxnMetadataStore.appendOp on its Oxia store."""
    await store.put_sequential(layout.op_prefix(most, least), op.to_json(), partition_key=layout.txn_key(most, least),
                               secondary_indexes=op.index_entries(most, least))


JAVA = """
import org.apache.pulsar.broker.transaction.metadata.*;
import java.io.*; import java.nio.charset.StandardCharsets;
public class Events {
%(decode)s
  public static void main(String[] a) throws Exception {
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String line;
    while ((line = in.readLine()) != null) {
      String[] f = line.split(" ", -1);
      if (f[0].equals("S")) {
        String s = dec(f[1]);
        System.out.println(TxnPaths.segmentEventsParent(s) + " " + TxnPaths.segmentKey(s));
      } else {
        String s = dec(f[1]); String sub = dec(f[2]);
        System.out.println(TxnPaths.subscriptionEventsParent(s, sub) + " " + TxnPaths.ackIndexKey(s, sub));
      }
    }
    byte[] event = TxnMetadataStore.toJson(new TxnEvent("2_7", TxnState.COMMITTED));
    System.out.println(new String(event, StandardCharsets.UTF_8));
  }
}
"""


async def test_events_match_pulsars_paths_partition_keys_and_bytes(tmp_path: Path) -> None:
    """Every distinct WRITE segment and every distinct (segment, subscription) gets exactly one event whose
    sequential prefix, partition key and value are Pulsar's, for names with spaces, reserved URL characters,
    non-ASCII, astral characters, lone surrogates, control characters, and very long names."""
    pairs = [(s, sub) for s in SEGMENTS for sub in SUBSCRIPTIONS]
    lines = [f"S {utf16_hex(s)}" for s in SEGMENTS] + [f"A {utf16_hex(s)} {utf16_hex(sub)}" for s, sub in pairs]
    out = run_java(tmp_path, "Events", JAVA % {"decode": JAVA_DECODE}, "\n".join(lines) + "\n")
    expected_segment = {tuple(x.split(" ")) for x in out[:len(SEGMENTS)]}
    expected_sub = {tuple(x.split(" ")) for x in out[len(SEGMENTS):len(SEGMENTS) + len(pairs)]}
    expected_value = out[-1].encode()

    store = RecordingStore()
    clock = FakeClock(1_795_447_209_230)
    config = CoordinatorConfig(partitions=4, partition=PartitionConfig(id_block_size=10), timeout_sweep=False,
                               gc_retention_s=900)
    tc = TransactionCoordinator(store, config, Metrics("v5"), clock)
    await tc.start()
    await tc.wait_recovered()
    try:
        part = tc.partition(2)
        least = await part.new_txn(60_000, None)
        # Each participant writes one op per message / ack: duplicates must give one event each.
        for _ in range(2):
            for seg in SEGMENTS:
                await _append_op(store, 2, least, TxnOp(OpKind.WRITE, seg, 0, 0))
            for seg, sub in pairs:
                await _append_op(store, 2, least, TxnOp(OpKind.ACK, seg, 7, 9, sub))
        store.puts.clear()
        await part.end_txn(least, True, None)
        # Pulsar's event names "2_<least>": the oracle was asked for "2_7", so compare the value's shape.
        value = expected_value.replace(b'"2_7"', f'"2_{least}"'.encode())
        seg_events = {(p.key, p.partition_key) for p in store.puts
                      if p.key.startswith(layout.SEGMENT_EVENTS_PREFIX)}
        sub_events = {(p.key, p.partition_key) for p in store.puts
                      if p.key.startswith(layout.SUBSCRIPTION_EVENTS_PREFIX)}
        assert all(p.sequential and p.value == value for p in store.puts), store.puts[:3]
        assert len(store.puts) == len(SEGMENTS) + len(pairs)
        assert seg_events == expected_segment
        assert sub_events == expected_sub
    finally:
        await tc.stop()
        await store.close()
