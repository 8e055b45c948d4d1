import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Random;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

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

/**
 * The chaos soak's application (tests/soak): a consume-transform-produce worker with
 * transactions, written as a real application would, plus a read_committed drain.
 *
 *   work URL INPUT OUTPUT UNTIL_FILE SEED THREADS ABORT_PERCENT TXN_TIMEOUT_MS
 *   drain URL TOPIC SUBSCRIPTION
 *
 * Each worker thread has its own Shared consumer on INPUT and shares one producer to OUTPUT. Per txn:
 * receive 1..8 inputs, send "out:<input>|<most>:<least>" to OUTPUT and ack each input in the txn, then
 * commit (or, ABORT_PERCENT of the time, abort deliberately). Any failure ends the txn (abort retried,
 * or the commit's outcome recorded as the coordinator gave it) and the consumer is re-subscribed so
 * the inputs come back. Every outcome is one JSON line on stdout.
 */
public final class ChaosCtp {
    static final String SUBSCRIPTION = "chaos";
    static final long OP_WAIT_MS = 30_000;

    static synchronized void emit(String json) {
        System.out.println(json);
        System.out.flush();
    }

    static String q(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", " ") + "\"";
    }

    static String list(List<String> values) {
        StringBuilder b = new StringBuilder("[");
        for (int i = 0; i < values.size(); i++) {
            if (i > 0) b.append(',');
            b.append(q(values.get(i)));
        }
        return b.append(']').toString();
    }

    static Throwable unwrap(Throwable e) {
        while ((e instanceof ExecutionException || e instanceof java.util.concurrent.CompletionException)
                && e.getCause() != null) {
            e = e.getCause();
        }
        return e;
    }

    static String describe(Throwable e) {
        Throwable t = unwrap(e);
        return t.getClass().getSimpleName() + ": " + t.getMessage();
    }

    /** The coordinator answered for this txn (it is ended or unknown); retrying cannot change that. */
    static boolean definitive(Throwable e) {
        Throwable t = unwrap(e);
        return t instanceof TransactionCoordinatorClientException.TransactionNotFoundException
                || t instanceof TransactionCoordinatorClientException.InvalidTxnStatusException
                || t instanceof PulsarClientException.TransactionHasOperationFailedException;
    }

    static PulsarClient client(String url) throws PulsarClientException {
        return PulsarClient.builder().serviceUrl(url).enableTransaction(true)
                .operationTimeout((int) OP_WAIT_MS, TimeUnit.MILLISECONDS).build();
    }

    static Consumer<String> subscribe(PulsarClient client, String topic, String sub) throws PulsarClientException {
        return client.newConsumer(Schema.STRING).topic(topic).subscriptionName(sub)
                .subscriptionType(SubscriptionType.Shared)
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe();
    }

    static Consumer<String> resubscribe(PulsarClient client, Consumer<String> old, String topic, int thread)
            throws InterruptedException {
        if (old != null) {
            try {
                old.close();
            } catch (PulsarClientException e) {
                emit("{\"ev\":\"close-failed\",\"thread\":" + thread + ",\"error\":" + q(describe(e)) + "}");
            }
        }
        while (true) {
            try {
                return subscribe(client, topic, SUBSCRIPTION);
            } catch (PulsarClientException e) {
                emit("{\"ev\":\"subscribe-retry\",\"thread\":" + thread + ",\"error\":" + q(describe(e)) + "}");
                Thread.sleep(500);
            }
        }
    }

    public static void main(String[] args) throws Exception {
        if (args[0].equals("drain")) {
            drain(args[1], args[2], args[3]);
            return;
        }
        String url = args[1], input = args[2], output = args[3];
        Path until = Path.of(args[4]);
        long seed = Long.parseLong(args[5]);
        int threads = Integer.parseInt(args[6]);
        int abortPercent = Integer.parseInt(args[7]);
        long txnTimeoutMs = Long.parseLong(args[8]);
        PulsarClient client = client(url);
        Producer<String> producer = client.newProducer(Schema.STRING).topic(output)
                .sendTimeout(0, TimeUnit.SECONDS).enableBatching(false)
                .messageRoutingMode(MessageRoutingMode.RoundRobinPartition).create();
        emit("{\"ev\":\"ready\"}");
        List<Thread> running = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            final int thread = t;
            Thread th = new Thread(() -> {
                try {
                    loop(client, producer, input, until, new Random(seed * 31 + thread), thread, abortPercent,
                            txnTimeoutMs);
                } catch (Throwable e) {
                    emit("{\"ev\":\"fatal\",\"thread\":" + thread + ",\"error\":" + q(describe(e)) + "}");
                }
            });
            th.start();
            running.add(th);
        }
        for (Thread th : running) th.join();
        emit("{\"ev\":\"done\"}");
        client.close();
        System.exit(0);
    }

    static void loop(PulsarClient client, Producer<String> producer, String input, Path until, Random rng,
                     int thread, int abortPercent, long txnTimeoutMs) throws Exception {
        Consumer<String> consumer = resubscribe(client, null, input, thread);
        long backoffMs = 100;
        while (true) {
            int batch = 1 + rng.nextInt(8);
            List<Message<String>> inputs = new ArrayList<>();
            Set<MessageId> seen = new HashSet<>();
            Message<String> m = consumer.receive(500, TimeUnit.MILLISECONDS);
            while (m != null) {
                if (seen.add(m.getMessageId())) inputs.add(m);
                m = inputs.size() < batch ? consumer.receive(20, TimeUnit.MILLISECONDS) : null;
            }
            if (inputs.isEmpty()) {
                if (Files.exists(until)) break;
                continue;
            }
            List<String> values = new ArrayList<>();
            for (Message<String> in : inputs) values.add(in.getValue());
            Transaction txn = null;
            String txnId = "none";
            String stage = "open";
            boolean deliberate = rng.nextInt(100) < abortPercent;
            try {
                txn = client.newTransaction().withTransactionTimeout(txnTimeoutMs, TimeUnit.MILLISECONDS).build()
                        .get(OP_WAIT_MS * 2, TimeUnit.MILLISECONDS);
                txnId = txn.getTxnID().getMostSigBits() + ":" + txn.getTxnID().getLeastSigBits();
                stage = "produce+ack";
                List<CompletableFuture<?>> ops = new ArrayList<>();
                for (Message<String> in : inputs) {
                    ops.add(producer.newMessage(txn).value("out:" + in.getValue() + "|" + txnId).sendAsync());
                    ops.add(consumer.acknowledgeAsync(in.getMessageId(), txn));
                }
                CompletableFuture.allOf(ops.toArray(CompletableFuture[]::new)).get(OP_WAIT_MS, TimeUnit.MILLISECONDS);
                if (deliberate) {
                    stage = "deliberate-abort";
                    String ended = abortUntilDecided(txn);
                    emit("{\"ev\":\"deliberate\",\"thread\":" + thread + ",\"txn\":" + q(txnId) + ",\"end\":"
                            + q(ended) + ",\"inputs\":" + list(values) + "}");
                    consumer = resubscribe(client, consumer, input, thread);
                    continue;
                }
                stage = "commit";
                commitUntilDecided(txn, txnId, thread);
                backoffMs = 100;
                emit("{\"ev\":\"committed\",\"thread\":" + thread + ",\"txn\":" + q(txnId) + ",\"inputs\":"
                        + list(values) + ",\"at\":" + System.currentTimeMillis() + "}");
            } catch (Exception e) {
                String ended;
                if (stage.equals("commit")) {
                    ended = definitive(e) ? "commit-refused" : "commit-unknown";
                } else if (txn == null) {
                    ended = "none";
                } else {
                    ended = abortUntilDecided(txn);
                }
                emit("{\"ev\":\"failure\",\"thread\":" + thread + ",\"stage\":" + q(stage) + ",\"txn\":" + q(txnId)
                        + ",\"end\":" + q(ended) + ",\"error\":" + q(describe(e)) + ",\"inputs\":" + list(values)
                        + ",\"at\":" + System.currentTimeMillis() + "}");
                consumer = resubscribe(client, consumer, input, thread);
                Thread.sleep(backoffMs);
                backoffMs = Math.min(backoffMs * 2, 2_000);
            }
        }
        consumer.close();
    }

    static void commitUntilDecided(Transaction txn, String txnId, int thread) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(OP_WAIT_MS * 4);
        int attempts = 0;
        while (true) {
            try {
                attempts++;
                txn.commit().get(OP_WAIT_MS, TimeUnit.MILLISECONDS);
                return;
            } catch (ExecutionException | TimeoutException e) {
                if (definitive(e) && attempts > 1) {
                    // An earlier attempt may have reached the coordinator and committed: a refusal now
                    // (e.g. the client's own txn timer) does not say what was decided. Outcome unknown.
                    throw new Exception("refused after a retried commit: " + describe(e));
                }
                if (definitive(e) || System.nanoTime() > deadline) throw e;
                emit("{\"ev\":\"commit-retry\",\"thread\":" + thread + ",\"txn\":" + q(txnId) + ",\"error\":"
                        + q(describe(e)) + "}");
                Thread.sleep(200);
            }
        }
    }

    /** "aborted" when the coordinator confirmed the abort, "abort:<error>" on a definitive refusal, else
     * "abort-gave-up". */
    static String abortUntilDecided(Transaction txn) {
        for (int attempt = 0; attempt < 40; attempt++) {
            try {
                txn.abort().get(OP_WAIT_MS, TimeUnit.MILLISECONDS);
                return "aborted";
            } catch (Exception e) {
                if (definitive(e)) return "abort:" + unwrap(e).getClass().getSimpleName();
                try {
                    Thread.sleep(300);
                } catch (InterruptedException ie) {
                    return "abort-interrupted";
                }
            }
        }
        return "abort-gave-up";
    }

    /** Everything committed on TOPIC: a new subscription from the earliest position, read up to a plain
     * marker sent now to each partition (a pinned partition never delivers its marker). */
    static void drain(String url, String topic, String sub) throws Exception {
        PulsarClient client = PulsarClient.builder().serviceUrl(url)
                .operationTimeout(60, TimeUnit.SECONDS).build();
        List<String> partitions = client.getPartitionsForTopic(topic).get(60, TimeUnit.SECONDS);
        Consumer<String> consumer = subscribe(client, topic, sub);
        Set<String> markers = new HashSet<>();
        for (int p = 0; p < partitions.size(); p++) {
            try (Producer<String> plain = client.newProducer(Schema.STRING).topic(partitions.get(p))
                    .enableBatching(false).create()) {
                String marker = "marker-" + sub + "-" + p;
                plain.send(marker);
                markers.add(marker);
            }
        }
        Set<String> pending = new HashSet<>(markers);
        List<String> values = new ArrayList<>();
        while (!pending.isEmpty()) {
            Message<String> m = consumer.receive(90, TimeUnit.SECONDS);
            if (m == null) break;
            consumer.acknowledge(m);
            if (!pending.remove(m.getValue()) && !markers.contains(m.getValue())) values.add(m.getValue());
        }
        emit("{\"ev\":\"drained\",\"markers_missing\":" + list(new ArrayList<>(pending)) + ",\"values\":"
                + list(values) + "}");
        client.close();
        System.exit(0);
    }
}
