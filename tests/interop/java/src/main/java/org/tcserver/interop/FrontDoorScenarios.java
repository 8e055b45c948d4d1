package org.tcserver.interop;

import java.lang.reflect.Field;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.regex.Pattern;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.PulsarClientException;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.schema.GenericRecord;
import org.apache.pulsar.client.impl.ClientCnx;
import org.apache.pulsar.client.impl.ConsumerImpl;
import org.apache.pulsar.client.impl.MultiTopicsConsumerImpl;
import org.apache.pulsar.client.impl.PartitionedProducerImpl;
import org.apache.pulsar.client.impl.ProducerImpl;

import static org.tcserver.interop.TcInterop.build;
import static org.tcserver.interop.TcInterop.emit;
import static org.tcserver.interop.TcInterop.obj;

/**
 * The front-door scenarios: the stock Java client with tc-server as its one service URL (and transactions
 * enabled, so coordinator discovery goes through it too) producing to and consuming from a real broker.
 * Each prints one {@code "event":"result"} line; the pytest driver (tests/e2e/test_front_door.py) asserts.
 *
 * <pre>
 *   produce-consume --topic T [--count N] [--subscription S]   N messages, consumer subscribed first
 *   pattern --pattern REGEX --topics T1,T2 [--count N]          a regex consumer over the given topics
 *   schema --topic T [--count N]                                 a JSON producer, a JSON and an AUTO_CONSUME consumer
 * common: --service-url URL, --op-timeout-ms T (default 10000), --receive-timeout-ms T (default 30000:
 *   how long a consumer waits for the next message before the scenario reports what is missing)
 * </pre>
 */
final class FrontDoorScenarios {
    private FrontDoorScenarios() {
    }

    // Coordinator discovery (PARTITIONED_METADATA + LOOKUP of the assign topic) goes through the same
    // service URL as every other lookup of the client (TcInterop.build): that is what the front door must
    // sort out.
    static void run(String scenario, Options o) throws Exception {
        switch (scenario) {
            case "produce-consume" -> produceConsume(o);
            case "pattern" -> pattern(o);
            case "schema" -> schema(o);
            default -> throw new IllegalArgumentException("not a front-door scenario: " + scenario);
        }
    }

    // ---- scenarios -------------------------------------------------------------------------------------

    private static void produceConsume(Options o) throws Exception {
        String topic = o.required("topic");
        int count = o.intOpt("count", 1000);
        try (PulsarClient client = build(o)) {
            Consumer<String> consumer = client.newConsumer(Schema.STRING).topic(topic)
                    .subscriptionName(o.get("subscription", "front-door"))
                    .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe();
            Producer<String> producer = client.newProducer(Schema.STRING).topic(topic)
                    .enableBatching(false).create();
            List<String> sent = sendAll(producer, "m", count);
            Received received = receiveAll(consumer, count, o.receiveTimeoutMs());
            emit(result("produce-consume", sent, received, Map.of(
                    "topic", topic,
                    "producer_connections", connections(producer),
                    "consumer_connections", connections(consumer))));
            producer.close();
            consumer.close();
        }
    }

    private static void pattern(Options o) throws Exception {
        String regex = o.required("pattern");
        List<String> topics = List.of(o.required("topics").split(","));
        int count = o.intOpt("count", 100);
        try (PulsarClient client = build(o)) {
            // Subscribed first (the topics exist already): discovery by GET_TOPICS_OF_NAMESPACE through the
            // service URL, then one consumer per matching topic.
            Consumer<String> consumer = client.newConsumer(Schema.STRING).topicsPattern(Pattern.compile(regex))
                    .subscriptionName("front-door-pattern")
                    .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe();
            List<String> subscribed = new ArrayList<>();
            if (consumer instanceof MultiTopicsConsumerImpl<String> multi) {
                subscribed.addAll(multi.getPartitionedTopics());
                subscribed.addAll(multi.getConsumers().stream().map(ConsumerImpl::getTopic).toList());
            }
            List<String> sent = new ArrayList<>();
            for (String topic : topics) {
                try (Producer<String> producer = client.newProducer(Schema.STRING).topic(topic)
                        .enableBatching(false).create()) {
                    sent.addAll(sendAll(producer, topic, count));
                }
            }
            Received received = receiveAll(consumer, sent.size(), o.receiveTimeoutMs());
            emit(result("pattern", sent, received, Map.of("subscribed", new TreeSet<>(subscribed).stream().toList(),
                    "by_topic", received.byTopic)));
            consumer.close();
        }
    }

    /** The value type of the schema scenario; public fields, as the JSON schema's Avro reflection wants. */
    public static final class Order {
        public String id;
        public long amount;

        public Order() {
        }

        Order(String id, long amount) {
            this.id = id;
            this.amount = amount;
        }
    }

    private static void schema(Options o) throws Exception {
        String topic = o.required("topic");
        int count = o.intOpt("count", 100);
        try (PulsarClient client = build(o)) {
            // The typed consumer registers the schema with its subscription; AUTO_CONSUME fetches it by
            // GET_SCHEMA through the service URL and decodes each message as a generic record.
            Consumer<Order> typed = client.newConsumer(Schema.JSON(Order.class)).topic(topic)
                    .subscriptionName("front-door-typed")
                    .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe();
            Producer<Order> producer = client.newProducer(Schema.JSON(Order.class)).topic(topic)
                    .enableBatching(false).create();
            Consumer<GenericRecord> generic = client.newConsumer(Schema.AUTO_CONSUME()).topic(topic)
                    .subscriptionName("front-door-generic")
                    .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe();
            List<String> sent = new ArrayList<>();
            List<CompletableFuture<MessageId>> sends = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                sent.add("o-" + i);
                sends.add(producer.sendAsync(new Order("o-" + i, i)));
            }
            CompletableFuture.allOf(sends.toArray(CompletableFuture[]::new)).get();

            Received typedIds = new Received();
            int typedWrongAmount = 0;
            for (int i = 0; i < count; i++) {
                Message<Order> m = typed.receive(o.receiveTimeoutMs(), TimeUnit.MILLISECONDS);
                if (m == null) {
                    break;
                }
                Order order = m.getValue();
                typedIds.add(order.id, m.getTopicName());
                if (!("o-" + order.amount).equals(order.id)) {
                    typedWrongAmount++;
                }
                typed.acknowledge(m);
            }
            Received genericIds = new Received();
            int genericWrongAmount = 0;
            String genericSchemaType = null;
            for (int i = 0; i < count; i++) {
                Message<GenericRecord> m = generic.receive(o.receiveTimeoutMs(), TimeUnit.MILLISECONDS);
                if (m == null) {
                    break;
                }
                GenericRecord record = m.getValue();
                genericSchemaType = String.valueOf(record.getSchemaType());
                String id = String.valueOf(record.getField("id"));
                genericIds.add(id, m.getTopicName());
                if (!("o-" + record.getField("amount")).equals(id)) {
                    genericWrongAmount++;
                }
                generic.acknowledge(m);
            }
            emit(obj("event", "result", "scenario", "schema", "topic", topic, "sent", count,
                    "typed", typedIds.summary(sent), "typed_wrong_amount", typedWrongAmount,
                    "generic", genericIds.summary(sent), "generic_wrong_amount", genericWrongAmount,
                    "generic_schema_type", genericSchemaType));
            producer.close();
            typed.close();
            generic.close();
        }
    }

    // ---- helpers ---------------------------------------------------------------------------------------

    private static List<String> sendAll(Producer<String> producer, String prefix, int count) throws Exception {
        List<String> sent = new ArrayList<>(count);
        List<CompletableFuture<MessageId>> sends = new ArrayList<>(count);
        for (int i = 0; i < count; i++) {
            String value = prefix + "-" + i;
            sent.add(value);
            sends.add(producer.sendAsync(value));
        }
        CompletableFuture.allOf(sends.toArray(CompletableFuture[]::new)).get();
        return sent;
    }

    /** Receive until {@code expected} messages arrived or none came for {@code timeoutMs}; ack each. */
    private static Received receiveAll(Consumer<String> consumer, int expected, int timeoutMs) throws Exception {
        Received received = new Received();
        while (received.total < expected) {
            Message<String> m = consumer.receive(timeoutMs, TimeUnit.MILLISECONDS);
            if (m == null) {
                break;
            }
            received.add(m.getValue(), m.getTopicName());
            consumer.acknowledge(m);
        }
        // A short extra wait catches duplicates delivered after the last expected message.
        Message<String> extra;
        while ((extra = consumer.receive(500, TimeUnit.MILLISECONDS)) != null) {
            received.add(extra.getValue(), extra.getTopicName());
            consumer.acknowledge(extra);
        }
        return received;
    }

    /** Values as they arrived, with the topic (partition) each came from. */
    private static final class Received {
        final Map<String, Integer> times = new LinkedHashMap<>();
        final Map<String, Integer> byTopic = new TreeMap<>();
        int total;

        void add(String value, String topic) {
            times.merge(value, 1, Integer::sum);
            byTopic.merge(topic, 1, Integer::sum);
            total++;
        }

        Map<String, Object> summary(List<String> sent) {
            List<String> missing = sent.stream().filter(v -> !times.containsKey(v)).toList();
            List<String> duplicated = times.entrySet().stream().filter(e -> e.getValue() > 1)
                    .map(Map.Entry::getKey).toList();
            List<String> unexpected = times.keySet().stream().filter(v -> !sent.contains(v)).toList();
            return obj("received", total, "distinct", times.size(), "duplicates", duplicated.size(),
                    "missing", missing.size(), "unexpected", unexpected.size(),
                    "missing_sample", missing.stream().limit(10).toList(),
                    "duplicate_sample", duplicated.stream().limit(10).toList(),
                    "partitions", byTopic.size());
        }
    }

    private static Map<String, Object> result(String scenario, List<String> sent, Received received,
                                              Map<String, Object> extra) {
        Map<String, Object> line = obj("event", "result", "scenario", scenario, "sent", sent.size());
        line.putAll(received.summary(sent));
        line.putAll(new TreeMap<>(extra));
        return line;
    }

    /**
     * Where each of a producer's or consumer's connections goes: the remote address of its socket and the
     * broker it named in CONNECT's proxy_to_broker_url (null: it connected to that address itself). Read
     * through reflection: the client keeps both to itself.
     */
    private static List<Object> connections(Object handle) {
        List<Object> handles = new ArrayList<>();
        if (handle instanceof PartitionedProducerImpl<?> partitioned) {
            handles.addAll(partitioned.getProducers());
        } else if (handle instanceof MultiTopicsConsumerImpl<?> multi) {
            handles.addAll(multi.getConsumers());
        } else {
            handles.add(handle);
        }
        List<Object> out = new ArrayList<>();
        for (Object h : handles) {
            ClientCnx cnx = h instanceof ProducerImpl<?> p ? p.getClientCnx()
                    : h instanceof ConsumerImpl<?> c ? c.getClientCnx() : null;
            if (cnx == null || cnx.ctx() == null) {
                out.add(null);
                continue;
            }
            out.add(obj("remote", String.valueOf(cnx.ctx().channel().remoteAddress()), "proxy_to", proxyTarget(cnx)));
        }
        return out;
    }

    private static String proxyTarget(ClientCnx cnx) {
        try {
            Field field = ClientCnx.class.getDeclaredField("proxyToTargetBrokerAddress");
            field.setAccessible(true);
            Object value = field.get(cnx);
            return value == null ? null : value.toString();
        } catch (ReflectiveOperationException | RuntimeException e) {
            return "unreadable: " + e;
        }
    }
}
