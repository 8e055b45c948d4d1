package org.tcserver.interop;

import static org.tcserver.interop.TcInterop.build;
import static org.tcserver.interop.TcInterop.close;
import static org.tcserver.interop.TcInterop.describe;
import static org.tcserver.interop.TcInterop.emit;
import static org.tcserver.interop.TcInterop.errorClass;
import static org.tcserver.interop.TcInterop.errorMessage;
import static org.tcserver.interop.TcInterop.msSince;
import static org.tcserver.interop.TcInterop.obj;
import static org.tcserver.interop.TcInterop.unwrap;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.MessageRoutingMode;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.PulsarClientException;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;
import org.apache.pulsar.client.api.transaction.Transaction;
import org.apache.pulsar.client.api.transaction.TransactionCoordinatorClientException;
import org.apache.pulsar.client.api.transaction.TxnID;

/**
 * Transactions that carry messages, through a service URL (tc-server in front of the brokers, or a
 * broker with its own coordinator): what the brokers do once the coordinator has decided. Same output
 * contract as {@link TcInterop}: JSON lines on stdout, the last one {@code "event":"result"}; the pytest
 * driver (tests/e2e/test_transactions*.py) owns every assertion.
 *
 * <pre>
 *   txn-produce --topic T --count N --action commit|abort|none [--visible-wait-ms W] [--receive-timeout-ms R]
 *               [--txn-timeout-ms T] [--pause-before-end F] [--pause-after-end G]
 *       N messages in one txn over every partition of T, a consumer subscribed before; what it sees before
 *       the end, after the end, and whether a plain message sent afterwards to every partition arrives.
 *       "none" leaves the txn to time out. With F / G it waits for that file to exist after the line
 *       "produced" / "ended", so the driver can stop a broker or restart the coordinator there.
 *   txn-ack --topic T --count N --action commit|abort [--receive-timeout-ms R]
 *       N plain messages received and acked in one txn; after the end: what the same consumer gets
 *       redelivered (abort), and what a new consumer on the subscription gets before a plain marker.
 *   ctp --input T --output U --until-file F [--fill N] [--batch B] [--txn-timeout-ms T]
 *       consume-transform-produce worker: receive a batch, produce "out:" + value and ack each input in
 *       one txn, commit; on any failure end the txn and subscribe again; stops when F exists and the
 *       input is drained. --fill N first sends "in-0".."in-(N-1)" to the input (plain). One line per committed txn and per failure.
 *   drain --topic T [--subscription S]
 *       every message on T from the earliest position, up to a plain marker sent to every partition.
 *   txn-bench --topic T --concurrency C --duration-s D [--warmup-s W] [--txn-timeout-ms T]
 *       closed loop of (new txn, one produced message, commit) in C threads; pairs/s and latencies.
 * common: --service-url URL (required), --op-timeout-ms T (client operationTimeout, default 10000)
 * </pre>
 */
final class TxnScenarios {
    private static final String SUBSCRIPTION = "tc-e2e";

    private TxnScenarios() {
    }

    static void run(String scenario, Options o) throws Exception {
        switch (scenario) {
            case "txn-produce" -> txnProduce(o);
            case "txn-ack" -> txnAck(o);
            case "ctp" -> ctp(o);
            case "txn-bench" -> txnBench(o);
            case "drain" -> drain(o);
            default -> throw new IllegalArgumentException("not a transaction scenario: " + scenario);
        }
    }

    // ---- txn-produce -----------------------------------------------------------------------------------

    private static void txnProduce(Options o) throws Exception {
        String topic = o.required("topic");
        int count = o.intOpt("count", 100);
        String action = o.get("action", "commit");
        boolean commit = action.equals("commit");
        if (!commit && !action.equals("abort") && !action.equals("none")) {
            throw new IllegalArgumentException("--action must be commit, abort or none, not " + action);
        }
        long visibleWaitMs = o.longOpt("visible-wait-ms", 2_000);
        long receiveTimeoutMs = o.receiveTimeoutMs();
        long txnTimeoutMs = o.longOpt("txn-timeout-ms", 60_000);
        PulsarClient client = build(o);
        List<String> partitions = client.getPartitionsForTopic(topic).get(30, TimeUnit.SECONDS);
        Consumer<String> consumer = subscribe(client, topic, SUBSCRIPTION);
        Producer<String> producer = txnProducer(client, topic);

        Transaction txn = newTxn(client, txnTimeoutMs);
        List<CompletableFuture<MessageId>> sends = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            sends.add(producer.newMessage(txn).value("txn-" + i).sendAsync());
        }
        // Every send is issued and most are still in flight: a test may cut the connection now.
        emit(obj("event", "sending", "count", count));
        for (CompletableFuture<MessageId> send : sends) {
            send.get(30, TimeUnit.SECONDS);
        }
        // Nothing may be visible while the txn is open; the wait is bounded, so this is "none within W".
        List<String> visibleBefore = receiveFor(consumer, visibleWaitMs);
        pause(o, "pause-before-end", obj("event", "produced", "most", txn.getTxnID().getMostSigBits(),
                "least", txn.getTxnID().getLeastSigBits(), "visible_before_end", visibleBefore));

        // "none" leaves the txn to the coordinator's timeout.
        long t0 = System.nanoTime();
        Map<String, Object> end = action.equals("none") ? obj("outcome", "not-ended")
                : outcome(commit ? txn.commit() : txn.abort());
        long endMs = msSince(t0);
        pause(o, "pause-after-end", obj("event", "ended", "end", end, "end_ms", endMs));

        // Right after commit() returns: every message arrives (bounded by R), none after an abort.
        List<String> afterEnd = new ArrayList<>();
        if (commit) {
            afterEnd.addAll(receiveUntil(consumer, count, receiveTimeoutMs, value -> value.startsWith("txn-")));
        }
        // One plain message per partition, sent after the end: each one arrives only if no read horizon
        // is left pinned by the transaction on its partition.
        List<String> markers = sendMarkers(client, partitions);
        List<String> afterMarkers = receiveUntilAll(consumer, markers, receiveTimeoutMs);
        emit(obj("event", "result", "scenario", "txn-produce", "action", action,
                "most", txn.getTxnID().getMostSigBits(), "least", txn.getTxnID().getLeastSigBits(),
                "count", count, "partitions", partitions.size(),
                "end", end, "end_ms", endMs, "visible_before_end", visibleBefore, "received_after_end", afterEnd,
                "markers_sent", markers, "received_with_markers", afterMarkers));
        close(client);
    }

    // ---- txn-ack ---------------------------------------------------------------------------------------

    private static void txnAck(Options o) throws Exception {
        String topic = o.required("topic");
        int count = o.intOpt("count", 20);
        boolean commit = commitAction(o);
        long receiveTimeoutMs = o.receiveTimeoutMs();
        PulsarClient client = build(o);
        Consumer<String> consumer = subscribe(client, topic, SUBSCRIPTION);
        try (Producer<String> plain = client.newProducer(Schema.STRING).topic(topic).enableBatching(false).create()) {
            for (int i = 0; i < count; i++) {
                plain.send("m-" + i);
            }
        }
        List<Message<String>> received = new ArrayList<>();
        while (received.size() < count) {
            Message<String> m = consumer.receive((int) receiveTimeoutMs, TimeUnit.MILLISECONDS);
            if (m == null) {
                throw new IllegalStateException("only " + received.size() + "/" + count + " plain messages arrived");
            }
            received.add(m);
        }
        Transaction txn = newTxn(client, 60_000);
        List<CompletableFuture<Void>> acks = new ArrayList<>();
        for (Message<String> m : received) {
            acks.add(consumer.acknowledgeAsync(m.getMessageId(), txn));
        }
        for (CompletableFuture<Void> ack : acks) {
            ack.get(30, TimeUnit.SECONDS);
        }
        Map<String, Object> end = outcome(commit ? txn.commit() : txn.abort());

        // An abort puts the acked messages back: the same consumer gets them again, without reconnecting.
        List<String> redelivered = new ArrayList<>();
        if (!commit) {
            for (Message<String> m : receiveMessages(consumer, count, receiveTimeoutMs)) {
                redelivered.add(m.getValue());
                consumer.acknowledge(m);
            }
        }
        // A new consumer on the subscription gets every message not acked, including any whose txn ack
        // the broker still holds as pending; then a plain marker sent now. Nothing may come before it.
        consumer.close();
        Consumer<String> fresh = subscribe(client, topic, SUBSCRIPTION);
        List<String> markers;
        try (Producer<String> plain = client.newProducer(Schema.STRING).topic(topic).enableBatching(false).create()) {
            plain.send("marker");
            markers = List.of("marker");
        }
        List<String> beforeMarker = new ArrayList<>(receiveUntilAll(fresh, markers, receiveTimeoutMs));
        boolean markerSeen = beforeMarker.remove("marker");
        emit(obj("event", "result", "scenario", "txn-ack", "action", commit ? "commit" : "abort",
                "most", txn.getTxnID().getMostSigBits(), "least", txn.getTxnID().getLeastSigBits(),
                "count", count, "end", end, "redelivered", redelivered, "marker_seen", markerSeen,
                "before_marker", beforeMarker));
        close(client);
    }

    // ---- ctp -------------------------------------------------------------------------------------------

    /**
     * Exactly-once consume-transform-produce. Each input is acked in the same txn that produces its output,
     * so the broker's pending-ack bookkeeping makes a second processing of an input fail (its ack conflicts)
     * unless the first txn aborted. What the worker must get right is the end of a txn whose commit failed:
     * retry commit() (the client allows it from COMMITTING) until the coordinator answers definitively, and
     * after any failure subscribe again so inputs it held are delivered again (those whose ack is still
     * pending in an undecided txn come back too, and their ack conflicts until that txn is ended).
     */
    private static void ctp(Options o) throws Exception {
        String input = o.required("input");
        String output = o.required("output");
        Path until = Path.of(o.required("until-file"));
        int batch = o.intOpt("batch", 10);
        long txnTimeoutMs = o.longOpt("txn-timeout-ms", 20_000);
        long pollMs = o.longOpt("poll-ms", 500);
        long opWaitMs = o.longOpt("op-wait-ms", 30_000);
        PulsarClient client = build(o);
        Producer<String> producer = txnProducer(client, output);
        Consumer<String> consumer = subscribe(client, input, SUBSCRIPTION);
        int fill = o.intOpt("fill", 0);
        if (fill > 0) {
            try (Producer<String> plain = client.newProducer(Schema.STRING).topic(input).enableBatching(false)
                    .messageRoutingMode(MessageRoutingMode.RoundRobinPartition).create()) {
                List<CompletableFuture<MessageId>> sends = new ArrayList<>();
                for (int i = 0; i < fill; i++) {
                    sends.add(plain.sendAsync("in-" + i));
                }
                CompletableFuture.allOf(sends.toArray(CompletableFuture[]::new)).get(120, TimeUnit.SECONDS);
            }
        }
        emit(obj("event", "ready", "filled", fill));
        long committedTxns = 0;
        long committedMessages = 0;
        long failures = 0;
        long backoffMs = 100;
        while (true) {
            List<Message<String>> inputs = new ArrayList<>();
            Set<MessageId> seen = new HashSet<>();
            Message<String> m = consumer.receive((int) pollMs, TimeUnit.MILLISECONDS);
            while (m != null) {
                if (seen.add(m.getMessageId())) {
                    inputs.add(m);
                }
                m = inputs.size() < batch ? consumer.receive(20, TimeUnit.MILLISECONDS) : null;
            }
            if (inputs.isEmpty()) {
                if (Files.exists(until)) {
                    break;
                }
                continue;
            }
            Transaction txn = null;
            String stage = "open";
            try {
                txn = client.newTransaction().withTransactionTimeout(txnTimeoutMs, TimeUnit.MILLISECONDS).build()
                        .get(opWaitMs, TimeUnit.MILLISECONDS);
                stage = "produce+ack";
                List<CompletableFuture<?>> ops = new ArrayList<>();
                for (Message<String> in : inputs) {
                    ops.add(producer.newMessage(txn).value("out:" + in.getValue()).sendAsync());
                    ops.add(consumer.acknowledgeAsync(in.getMessageId(), txn));
                }
                CompletableFuture.allOf(ops.toArray(CompletableFuture[]::new)).get(opWaitMs, TimeUnit.MILLISECONDS);
                stage = "commit";
                commitUntilDecided(txn, opWaitMs);
                committedTxns++;
                committedMessages += inputs.size();
                backoffMs = 100;
                emit(obj("event", "committed", "most", txn.getTxnID().getMostSigBits(),
                        "least", txn.getTxnID().getLeastSigBits(), "n", inputs.size(),
                        "total", committedMessages, "at", System.currentTimeMillis()));
            } catch (Exception e) {
                failures++;
                String ended = txn == null ? "none" : endAfterFailure(txn, stage, opWaitMs);
                emit(obj("event", "failure", "stage", stage, "error", describe(e), "txn_end", ended,
                        "most", txn == null ? null : txn.getTxnID().getMostSigBits(),
                        "least", txn == null ? null : txn.getTxnID().getLeastSigBits(),
                        "n", inputs.size(), "at", System.currentTimeMillis()));
                consumer = resubscribe(client, consumer, input);
                Thread.sleep(backoffMs);
                backoffMs = Math.min(backoffMs * 2, 2_000);
            }
        }
        emit(obj("event", "result", "scenario", "ctp", "committed_txns", committedTxns,
                "committed_messages", committedMessages, "failures", failures));
        close(client);
    }

    /**
     * Everything on T (a new subscription from the earliest position) up to a plain marker sent now to
     * every partition: a partition whose read horizon a transaction pins never delivers its marker.
     */
    private static void drain(Options o) throws Exception {
        String topic = o.required("topic");
        long receiveTimeoutMs = o.receiveTimeoutMs();
        PulsarClient client = build(o);
        List<String> partitions = client.getPartitionsForTopic(topic).get(30, TimeUnit.SECONDS);
        Consumer<String> consumer = subscribe(client, topic, o.get("subscription", "tc-e2e-drain"));
        List<String> markers = sendMarkers(client, partitions);
        List<String> values = new ArrayList<>(receiveUntilAll(consumer, markers, receiveTimeoutMs));
        List<String> markersSeen = new ArrayList<>();
        for (String marker : markers) {
            if (values.remove(marker)) {
                markersSeen.add(marker);
            }
        }
        emit(obj("event", "result", "scenario", "drain", "partitions", partitions.size(),
                "markers_sent", markers, "markers_seen", markersSeen, "values", values));
        close(client);
    }

    /** commit() until the coordinator answers it: success, or an error that says the txn is aborted. */
    private static void commitUntilDecided(Transaction txn, long opWaitMs) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(opWaitMs * 4);
        while (true) {
            try {
                txn.commit().get(opWaitMs, TimeUnit.MILLISECONDS);
                return;
            } catch (ExecutionException | TimeoutException e) {
                if (definitive(e) || System.nanoTime() > deadline) {
                    throw e;
                }
                emit(obj("event", "commit-retry", "most", txn.getTxnID().getMostSigBits(),
                        "least", txn.getTxnID().getLeastSigBits(), "error", describe(e)));
                Thread.sleep(200);
            }
        }
    }

    /**
     * After a failure before the commit, abort (retried while the coordinator is away); after a failed
     * commit the outcome is whatever the coordinator decided. Returns what happened, for the log line.
     */
    private static String endAfterFailure(Transaction txn, String stage, long opWaitMs) {
        if (stage.equals("commit")) {
            return "commit-failed:" + txn.getState();
        }
        for (int attempt = 0; attempt < 20; attempt++) {
            try {
                txn.abort().get(opWaitMs, TimeUnit.MILLISECONDS);
                return "aborted";
            } catch (Exception e) {
                if (definitive(e)) {
                    return "abort:" + errorClass(e);
                }
                sleepQuietly(200);
            }
        }
        return "abort-gave-up";
    }

    /** The coordinator answered for this txn (it is ended or unknown); retrying cannot change that. */
    private static boolean definitive(Throwable e) {
        Throwable t = unwrap(e);
        return t instanceof TransactionCoordinatorClientException.TransactionNotFoundException
                || t instanceof TransactionCoordinatorClientException.InvalidTxnStatusException
                || t instanceof PulsarClientException.TransactionHasOperationFailedException;
    }

    private static Consumer<String> resubscribe(PulsarClient client, Consumer<String> old, String topic)
            throws InterruptedException {
        try {
            old.close();
        } catch (PulsarClientException e) {
            System.err.println("closing the consumer: " + e);
        }
        while (true) {
            try {
                return subscribe(client, topic, SUBSCRIPTION);
            } catch (PulsarClientException e) {
                emit(obj("event", "subscribe-retry", "error", describe(e)));
                Thread.sleep(500);
            }
        }
    }

    // ---- txn-bench -------------------------------------------------------------------------------------

    private static void txnBench(Options o) throws Exception {
        String topic = o.required("topic");
        int concurrency = o.intOpt("concurrency", 16);
        long durationMs = o.longOpt("duration-s", 20) * 1000;
        long warmupMs = o.longOpt("warmup-s", 5) * 1000;
        long txnTimeoutMs = o.longOpt("txn-timeout-ms", 60_000);
        PulsarClient client = build(o);
        Producer<String> producer = txnProducer(client, topic);
        AtomicBoolean stop = new AtomicBoolean();
        AtomicLong errors = new AtomicLong();
        long measureFrom = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(warmupMs);
        long measureTo = measureFrom + TimeUnit.MILLISECONDS.toNanos(durationMs);
        List<long[]> perThread = new ArrayList<>();
        CountDownLatch done = new CountDownLatch(concurrency);
        for (int t = 0; t < concurrency; t++) {
            // Per pair: start, commit start, end (ns); only pairs that start inside the window count.
            long[] samples = new long[3 * 2_000_000 / concurrency];
            perThread.add(samples);
            final int thread = t;
            Thread worker = new Thread(() -> {
                int n = 0;
                long i = 0;
                try {
                    while (!stop.get()) {
                        long start = System.nanoTime();
                        try {
                            Transaction txn = client.newTransaction()
                                    .withTransactionTimeout(txnTimeoutMs, TimeUnit.MILLISECONDS).build().get();
                            producer.newMessage(txn).value("b-" + thread + "-" + i++).send();
                            long commitStart = System.nanoTime();
                            txn.commit().get();
                            long end = System.nanoTime();
                            if (start >= measureFrom && end <= measureTo && n + 4 <= samples.length) {
                                samples[n++] = start;
                                samples[n++] = commitStart;
                                samples[n++] = end;
                            }
                        } catch (Exception e) {
                            if (start >= measureFrom && errors.incrementAndGet() <= 5) {
                                System.err.println("bench pair failed: " + describe(e));
                            }
                        }
                    }
                } finally {
                    samples[samples.length - 1] = n;
                    done.countDown();
                }
            });
            worker.start();
        }
        // The counted window's edges, for a driver that reads the servers' CPU time there.
        Thread.sleep(Math.max(0, TimeUnit.NANOSECONDS.toMillis(measureFrom - System.nanoTime())));
        emit(obj("event", "measure-start"));
        Thread.sleep(Math.max(0, TimeUnit.NANOSECONDS.toMillis(measureTo - System.nanoTime())));
        emit(obj("event", "measure-end"));
        stop.set(true);
        done.await(60, TimeUnit.SECONDS);
        List<Long> pair = new ArrayList<>();
        List<Long> commit = new ArrayList<>();
        for (long[] samples : perThread) {
            int n = (int) samples[samples.length - 1];
            for (int k = 0; k + 2 < n; k += 3) {
                pair.add(samples[k + 2] - samples[k]);
                commit.add(samples[k + 2] - samples[k + 1]);
            }
        }
        long[] pairs = pair.stream().mapToLong(Long::longValue).sorted().toArray();
        long[] commits = commit.stream().mapToLong(Long::longValue).sorted().toArray();
        double seconds = durationMs / 1000.0;
        emit(obj("event", "result", "scenario", "txn-bench", "concurrency", concurrency,
                "duration_s", seconds, "pairs", pairs.length, "errors", errors.get(),
                "pairs_per_s", Math.round(pairs.length / seconds * 10) / 10.0,
                "pair_p50_ms", ms(percentile(pairs, 0.50)), "pair_p99_ms", ms(percentile(pairs, 0.99)),
                "commit_p50_ms", ms(percentile(commits, 0.50)), "commit_p99_ms", ms(percentile(commits, 0.99))));
        close(client);
    }

    private static long percentile(long[] sorted, double q) {
        if (sorted.length == 0) {
            return -1;
        }
        return sorted[Math.min(sorted.length - 1, (int) Math.ceil(q * sorted.length) - 1)];
    }

    private static double ms(long nanos) {
        return nanos < 0 ? -1 : Math.round(nanos / 10_000.0) / 100.0;
    }

    // ---- client plumbing -------------------------------------------------------------------------------

    /** A producer that may send in a txn: the client refuses transactional sends while a send timeout is set. */
    private static Producer<String> txnProducer(PulsarClient client, String topic) throws PulsarClientException {
        return client.newProducer(Schema.STRING).topic(topic)
                .sendTimeout(0, TimeUnit.SECONDS)
                .enableBatching(false)
                .messageRoutingMode(MessageRoutingMode.RoundRobinPartition)
                .create();
    }

    private static Consumer<String> subscribe(PulsarClient client, String topic, String subscription)
            throws PulsarClientException {
        return client.newConsumer(Schema.STRING).topic(topic).subscriptionName(subscription)
                .subscriptionType(SubscriptionType.Shared)
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                .subscribe();
    }

    private static Transaction newTxn(PulsarClient client, long timeoutMs) throws Exception {
        return client.newTransaction().withTransactionTimeout(timeoutMs, TimeUnit.MILLISECONDS).build()
                .get(60, TimeUnit.SECONDS);
    }

    private static List<String> sendMarkers(PulsarClient client, List<String> partitions) throws Exception {
        List<String> markers = new ArrayList<>();
        for (int p = 0; p < partitions.size(); p++) {
            try (Producer<String> plain = client.newProducer(Schema.STRING).topic(partitions.get(p))
                    .enableBatching(false).create()) {
                String marker = "plain-" + p;
                plain.send(marker);
                markers.add(marker);
            }
        }
        return markers;
    }

    /** Everything that arrives within {@code waitMs}. */
    private static List<String> receiveFor(Consumer<String> consumer, long waitMs) throws PulsarClientException {
        List<String> out = new ArrayList<>();
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(waitMs);
        while (true) {
            long left = TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime());
            if (left <= 0) {
                return out;
            }
            Message<String> m = consumer.receive((int) left, TimeUnit.MILLISECONDS);
            if (m == null) {
                return out;
            }
            out.add(m.getValue());
            consumer.acknowledge(m);
        }
    }

    /** Up to {@code count} messages; gives up once nothing arrived for {@code idleMs}. */
    private static List<Message<String>> receiveMessages(Consumer<String> consumer, int count, long idleMs)
            throws PulsarClientException {
        List<Message<String>> out = new ArrayList<>();
        while (out.size() < count) {
            Message<String> m = consumer.receive((int) idleMs, TimeUnit.MILLISECONDS);
            if (m == null) {
                break;
            }
            out.add(m);
        }
        return out;
    }

    /** Messages (acked) until {@code count} of them match, or nothing arrived for {@code idleMs}. */
    private static List<String> receiveUntil(Consumer<String> consumer, int count, long idleMs,
                                              java.util.function.Predicate<String> counts)
            throws PulsarClientException {
        List<String> out = new ArrayList<>();
        int matched = 0;
        while (matched < count) {
            Message<String> m = consumer.receive((int) idleMs, TimeUnit.MILLISECONDS);
            if (m == null) {
                break;
            }
            consumer.acknowledge(m);
            out.add(m.getValue());
            if (counts.test(m.getValue())) {
                matched++;
            }
        }
        return out;
    }

    /** Messages (acked) until every one of {@code wanted} was among them, or nothing arrived for {@code idleMs}. */
    private static List<String> receiveUntilAll(Consumer<String> consumer, List<String> wanted, long idleMs)
            throws PulsarClientException {
        Set<String> missing = new HashSet<>(wanted);
        List<String> out = new ArrayList<>();
        while (!missing.isEmpty()) {
            Message<String> m = consumer.receive((int) idleMs, TimeUnit.MILLISECONDS);
            if (m == null) {
                break;
            }
            consumer.acknowledge(m);
            out.add(m.getValue());
            missing.remove(m.getValue());
        }
        return out;
    }

    /** Emit {@code line}; then, when option {@code name} names a file, wait until the driver creates it. */
    private static void pause(Options o, String name, Map<String, Object> line) throws InterruptedException {
        emit(line);
        String file = o.values().get(name);
        if (file == null) {
            return;
        }
        Path path = Path.of(file);
        while (!Files.exists(path)) {
            Thread.sleep(100);
        }
    }

    private static boolean commitAction(Options o) {
        String action = o.get("action", "commit");
        if (!action.equals("commit") && !action.equals("abort")) {
            throw new IllegalArgumentException("--action must be commit or abort, not " + action);
        }
        return action.equals("commit");
    }

    private static void sleepQuietly(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    // ---- output ----------------------------------------------------------------------------------------


    private static Map<String, Object> outcome(CompletableFuture<?> future) {
        long start = System.nanoTime();
        try {
            future.get(120, TimeUnit.SECONDS);
            return obj("outcome", "ok", "ms", msSince(start));
        } catch (ExecutionException | InterruptedException | TimeoutException e) {
            return obj("outcome", errorClass(e), "message", errorMessage(e), "ms", msSince(start));
        }
    }

}
