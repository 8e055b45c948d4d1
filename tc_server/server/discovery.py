"""Coordinator discovery through the assign topic (pulsar-protocol.md §3, "Assign-topic path").

The Java client asks PARTITIONED_METADATA for the assign topic, makes one handler per partition
(tcId = partition index) and LOOKUPs ``<assign topic>-partition-<i>``. tc-server serves only these
topics; anything else goes to the upstream broker (server/upstream.py), or without one gets a Failed
answer naming the setting to set.
"""

from __future__ import annotations

ASSIGN_TOPIC = "persistent://pulsar/system/transaction_coordinator_assign"
_SHORT_ASSIGN_TOPIC = "pulsar/system/transaction_coordinator_assign"
PARTITION_SUFFIX = "-partition-"
# Partition indexes are Java ints (TopicName.getPartitionIndex): 2147483647 has 10 digits.
_MAX_INDEX_DIGITS = 10


def _full_name(topic: str) -> str:
    # Clients send fully qualified names, but "tenant/ns/topic" means persistent:// too.
    return topic if "://" in topic else f"persistent://{topic}"


def is_assign_topic(topic: str) -> bool:
    return _full_name(topic) == ASSIGN_TOPIC


def assign_partition(topic: str) -> int | None:
    """The tcId a LOOKUP topic names, or None when it is not the assign topic.

    ``…-partition-i`` names partition i; the bare assign topic names 0, as clients up to 2.10 used
    one handler (tcId 0) on the non-partitioned name (PR #18276).
    """
    name = _full_name(topic)
    if name == ASSIGN_TOPIC:
        return 0
    prefix = ASSIGN_TOPIC + PARTITION_SUFFIX
    if name.startswith(prefix):
        index = name[len(prefix):]
        # ASCII digits only, at most a 32-bit partition index's 10: str.isdigit() also accepts "²"
        # and other Unicode digits, which int() refuses or reads, and int() refuses more than 4,300
        # digits (issue 15). Such a topic is no partition of ours: the caller answers TopicNotFound.
        if (0 < len(index) <= _MAX_INDEX_DIGITS and index.isascii() and index.isdigit()
                and (index == "0" or not index.startswith("0"))):
            return int(index)
    return None


NOT_SERVED = (
    f"tc-server is a transaction coordinator; it serves only {ASSIGN_TOPIC} and its partitions. "
    "To use tc-server as the service URL for everything, set --upstream-url pulsar://BROKER:6650 "
    "(TC_SERVER_UPSTREAM_URL) so that other topics are forwarded to your brokers"
)
