package org.tcserver.v5;

import java.io.PrintStream;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.transaction.TxnID;
import org.apache.pulsar.client.api.v5.Message;
import org.apache.pulsar.client.api.v5.MessageId;
import org.apache.pulsar.client.api.v5.Producer;
import org.apache.pulsar.client.api.v5.PulsarClient;
import org.apache.pulsar.client.api.v5.StreamConsumer;
import org.apache.pulsar.client.api.v5.Transaction;
import org.apache.pulsar.client.api.v5.config.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.v5.config.TransactionPolicy;
import org.apache.pulsar.client.api.v5.schema.Schema;

/**
 * Pulsar 5's v5 SDK (pulsar-client-v5 5.0.0-M1) for tests/v5/test_v5_sdk_e2e.py. One JSON object per line on
 * stdout (the client's own logging goes to stderr); exit 0 on success, 1 with an {"event":"error"} line.
 *
 * <pre>
 * produce SERVICE_URL TOPIC COUNT PREFIX commit|abort|plain
 *     COUNT string messages PREFIX-0 .. PREFIX-(COUNT-1) to TOPIC (topic://tenant/ns/name, a scalable topic);
 *     commit / abort: all in one transaction from client.newTransaction(), then commit() / abort();
 *     plain: no transaction. Lines: txn {most,least}, sent {value,id}, committed / aborted, done.
 * consume SERVICE_URL TOPIC SUBSCRIPTION UNTIL TIMEOUT_S
 *     a stream consumer on a new subscription from the earliest position; prints every message it
 *     receives (received {value}) until the one whose value is UNTIL, then done; error after TIMEOUT_S
 *     without it. A message written before UNTIL and not received by then was not visible. Nothing is
 *     acknowledged: the subscription keeps its backlog, so the broker keeps the segment's ledgers (with
 *     no retention policy it deletes a ledger every subscription has consumed, at the latest on restart).
 * </pre>
 */
public final class Harness {
    private static final PrintStream OUT = new PrintStream(System.out, true, StandardCharsets.UTF_8);

    private Harness() {
    }

    public static void main(String[] args) {
        // The client's log lines must never mix with the JSON lines the test reads.
        System.setOut(System.err);
        int code;
        try {
            code = run(args);
        } catch (Throwable e) {
            emit("{\"event\":\"error\",\"message\":" + quote(describe(e)) + "}");
            code = 1;
        }
        OUT.flush();
        // The client's netty threads are not daemons; close() has run, do not wait for them.
        Runtime.getRuntime().halt(code);
    }

    private static int run(String[] args) throws Exception {
        if (args.length < 2) {
            emit("{\"event\":\"error\",\"message\":\"usage: produce|consume SERVICE_URL ...\"}");
            return 2;
        }
        // transactionPolicy() is what enables transactions in the v5 builder (PulsarClientBuilderV5 sets
        // enableTransaction there; scalableTransactions, the scalable=true flag, is always on).
        try (PulsarClient client = PulsarClient.builder().serviceUrl(args[1])
                .operationTimeout(Duration.ofSeconds(30))
                .transactionPolicy(TransactionPolicy.builder().timeout(Duration.ofSeconds(120)).build())
                .build()) {
            switch (args[0]) {
                case "produce" -> produce(client, args[2], Integer.parseInt(args[3]), args[4], args[5]);
                case "consume" -> consume(client, args[2], args[3], args[4], Integer.parseInt(args[5]));
                default -> {
                    emit("{\"event\":\"error\",\"message\":" + quote("unknown command " + args[0]) + "}");
                    return 2;
                }
            }
        }
        emit("{\"event\":\"done\"}");
        return 0;
    }

    private static void produce(PulsarClient client, String topic, int count, String prefix, String mode)
            throws Exception {
        if (!mode.equals("commit") && !mode.equals("abort") && !mode.equals("plain")) {
            throw new IllegalArgumentException("mode must be commit, abort or plain, not " + mode);
        }
        try (Producer<String> producer = client.newProducer(Schema.string()).topic(topic).create()) {
            Transaction txn = null;
            if (!mode.equals("plain")) {
                txn = client.newTransaction();
                TxnID id = txnId(txn);
                emit("{\"event\":\"txn\",\"most\":" + id.getMostSigBits() + ",\"least\":" + id.getLeastSigBits()
                        + "}");
            }
            for (int i = 0; i < count; i++) {
                String value = prefix + "-" + i;
                var message = producer.newMessage().value(value);
                if (txn != null) {
                    message = message.transaction(txn);
                }
                MessageId sent = message.send();
                emit("{\"event\":\"sent\",\"value\":" + quote(value) + ",\"id\":" + quote(String.valueOf(sent)) + "}");
            }
            if (txn != null && mode.equals("commit")) {
                txn.commit();
                emit("{\"event\":\"committed\"}");
            } else if (txn != null) {
                txn.abort();
                emit("{\"event\":\"aborted\"}");
            }
        }
    }

    private static void consume(PulsarClient client, String topic, String subscription, String until,
                                int timeoutS) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(timeoutS);
        try (StreamConsumer<String> consumer = client.newStreamConsumer(Schema.string()).topic(topic)
                .subscriptionName(subscription).subscriptionInitialPosition(SubscriptionInitialPosition.EARLIEST)
                .subscribe()) {
            while (System.nanoTime() < deadline) {
                Message<String> message = consumer.receive(Duration.ofSeconds(1));
                if (message == null) {
                    continue;
                }
                emit("{\"event\":\"received\",\"value\":" + quote(message.value()) + ",\"id\":"
                        + quote(String.valueOf(message.id())) + "}");
                if (message.value().equals(until)) {
                    return;
                }
            }
        }
        throw new IllegalStateException("no message " + until + " on " + topic + " within " + timeoutS + " s");
    }

    /** The id the coordinator minted: the v5 Transaction wraps the v4 one (TransactionV5.v4Transaction()). */
    private static TxnID txnId(Transaction txn) throws Exception {
        Method unwrap = txn.getClass().getDeclaredMethod("v4Transaction");
        unwrap.setAccessible(true);
        return ((org.apache.pulsar.client.api.transaction.Transaction) unwrap.invoke(txn)).getTxnID();
    }

    private static String describe(Throwable e) {
        StringBuilder text = new StringBuilder();
        for (Throwable t = e; t != null; t = t.getCause() == t ? null : t.getCause()) {
            if (text.length() > 0) {
                text.append(" <- ");
            }
            text.append(t.getClass().getName()).append(": ").append(t.getMessage());
        }
        return text.toString();
    }

    private static synchronized void emit(String line) {
        OUT.println(line);
    }

    private static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                default -> {
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
                }
            }
        }
        return b.append('"').toString();
    }
}
