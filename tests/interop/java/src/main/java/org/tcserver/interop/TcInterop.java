package org.tcserver.interop;

import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.pulsar.client.api.AuthenticationFactory;
import org.apache.pulsar.client.api.ClientBuilder;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.PulsarClientException;
import org.apache.pulsar.client.api.transaction.Transaction;
import org.apache.pulsar.client.api.transaction.TxnID;
import org.apache.pulsar.client.impl.ClientCnx;
import org.apache.pulsar.client.impl.PulsarClientImpl;
import org.apache.pulsar.client.impl.transaction.TransactionCoordinatorClientImpl;

/**
 * Runs one scenario of the official Java client against a transaction coordinator and prints JSON lines
 * on stdout: zero or more {@code "event"} lines, then one {@code "event":"result"} line. The pytest
 * driver (tests/interop/test_java.py) owns every assertion; this program only reports what the client
 * did, so a server bug shows up as data (exception class, elapsed time) rather than as a harness crash.
 *
 * <pre>
 * java -jar target/tc-interop.jar SCENARIO --service-url pulsar://127.0.0.1:6650 [options]
 *   concurrent  --count N            open N txns at once, then commit the even ones and abort the odd ones
 *   timeout     --txn-timeout-ms T --sleep-ms S   let a txn time out, then commit it (client and TC client)
 *   tc-errors                        END_TXN error mapping through the TC client, then a fresh txn
 *   commit-loop --until-file F       open+commit in a loop, one line per commit, until F exists
 *   build-only                       build a client (--op-timeout-ms bounds it) and report how long it took
 * common: --op-timeout-ms T (client operationTimeout, default 10000); --token JWT, --tls-trust-certs CA.pem,
 *         --tls-cert C.pem --tls-key K.pem (see withSecurity)
 * </pre>
 */
public final class TcInterop {
    private static final long DEFAULT_OP_TIMEOUT_MS = 10_000;

    private TcInterop() {
    }

    public static void main(String[] argv) {
        Args args;
        try {
            args = Args.parse(argv);
        } catch (IllegalArgumentException e) {
            System.err.println("usage error: " + e.getMessage());
            System.exit(2);
            return;
        }
        int code = 0;
        try {
            switch (args.scenario) {
                case "concurrent" -> concurrent(args.options);
                case "timeout" -> timeout(args.options);
                case "tc-errors" -> tcErrors(args.options);
                case "commit-loop" -> commitLoop(args.options);
                case "build-only" -> buildOnly(args.options);
                case "txn-produce", "txn-ack", "ctp", "drain", "txn-bench" -> TxnScenarios.run(args.scenario, args.options);
                case "produce-consume", "pattern", "schema" -> FrontDoorScenarios.run(args.scenario, args.options);
                case "pair-bench" -> BenchScenarios.pairBench(args.options.required("service-url"), args.options.intOpt("concurrency", 16), args.options.longOpt("duration-ms", 20_000), args.options.longOpt("warmup-ms", 5_000), args.options.longOpt("txn-timeout-ms", 60_000));
                default -> {
                    System.err.println("unknown scenario: " + args.scenario);
                    code = 2;
                }
            }
        } catch (Throwable t) {
            t.printStackTrace();
            emit(obj("event", "fatal", "scenario", args.scenario, "error", describe(t)));
            code = 1;
        }
        System.out.flush();
        // The client's netty threads are non-daemon; exit explicitly once the result line is out.
        Runtime.getRuntime().halt(code);
    }

    // ---- scenarios -------------------------------------------------------------------------------------

    private static void concurrent(Options o) throws Exception {
        int count = o.intOpt("count", 1000);
        long txnTimeoutMs = o.longOpt("txn-timeout-ms", 60_000);
        long t0 = System.nanoTime();
        PulsarClient client = build(o);
        long buildMs = msSince(t0);
        List<Object> connections = handlerConnections(client);

        long t1 = System.nanoTime();
        List<CompletableFuture<Transaction>> opens = new ArrayList<>(count);
        for (int i = 0; i < count; i++) {
            opens.add(client.newTransaction().withTransactionTimeout(txnTimeoutMs, TimeUnit.MILLISECONDS).build());
        }
        CompletableFuture.allOf(opens.toArray(CompletableFuture[]::new)).handle((v, e) -> null).join();
        long openMs = msSince(t1);

        long t2 = System.nanoTime();
        List<CompletableFuture<Map<String, Object>>> ends = new ArrayList<>(count);
        for (int i = 0; i < count; i++) {
            final int index = i;
            final boolean commit = i % 2 == 0;
            CompletableFuture<Map<String, Object>> end = opens.get(i).thenCompose(txn -> {
                TxnID id = txn.getTxnID();
                CompletableFuture<Void> op = commit ? txn.commit() : txn.abort();
                return op.handle((ok, err) -> obj("event", "txn", "index", index,
                        "most", id.getMostSigBits(), "least", id.getLeastSigBits(),
                        "action", commit ? "commit" : "abort", "outcome", err == null ? "ok" : errorClass(err)));
            }).exceptionally(err -> obj("event", "txn", "index", index, "most", null, "least", null,
                    "action", "open", "outcome", errorClass(err), "message", errorMessage(err)));
            ends.add(end);
        }
        int failed = 0;
        for (CompletableFuture<Map<String, Object>> end : ends) {
            Map<String, Object> line = end.join();
            if (!"ok".equals(line.get("outcome"))) {
                failed++;
            }
            emit(line);
        }
        long endMs = msSince(t2);
        emit(obj("event", "result", "scenario", "concurrent", "count", count, "failed", failed,
                "coordinators", connections.size(), "handler_connections", connections,
                "build_ms", buildMs, "open_ms", openMs, "end_ms", endMs));
        close(client);
    }

    private static void timeout(Options o) throws Exception {
        long txnTimeoutMs = o.longOpt("txn-timeout-ms", 2_000);
        long sleepMs = o.longOpt("sleep-ms", 3_000);
        PulsarClient client = build(o);
        TransactionCoordinatorClientImpl tc = ((PulsarClientImpl) client).getTcClient();
        Transaction txn = client.newTransaction()
                .withTransactionTimeout(txnTimeoutMs, TimeUnit.MILLISECONDS).build().get();
        TxnID id = txn.getTxnID();
        Thread.sleep(sleepMs);
        // Transaction.commit() is checked against the client's own timer first (TransactionImpl moves
        // OPEN -> TIME_OUT when its timeout fires), so it may never reach the server; the TC client call
        // below always sends END_TXN, which is the server behaviour under test.
        Map<String, Object> commit = outcome(txn.commit());
        String stateAfter = String.valueOf(txn.getState());
        Map<String, Object> tcCommit = outcome(tc.commitAsync(id));
        Map<String, Object> tcAbort = outcome(tc.abortAsync(id));
        emit(obj("event", "result", "scenario", "timeout", "most", id.getMostSigBits(),
                "least", id.getLeastSigBits(), "txn_timeout_ms", txnTimeoutMs, "sleep_ms", sleepMs,
                "commit", commit, "state_after_commit", stateAfter, "tc_commit", tcCommit, "tc_abort", tcAbort));
        close(client);
    }

    private static void tcErrors(Options o) throws Exception {
        PulsarClient client = build(o);
        TransactionCoordinatorClientImpl tc = ((PulsarClientImpl) client).getTcClient();
        List<Object> before = handlerConnections(client);
        Transaction txn = client.newTransaction().withTransactionTimeout(60, TimeUnit.SECONDS).build().get();
        TxnID id = txn.getTxnID();
        // Far beyond anything the server can have handed out, on a coordinator the client knows, so the
        // request reaches the server instead of failing client-side with MetaStoreHandlerNotExists.
        TxnID unknown = new TxnID(id.getMostSigBits(), id.getLeastSigBits() + 1_000_000_000_000L);
        Map<String, Object> steps = new LinkedHashMap<>();
        steps.put("commit", outcome(tc.commitAsync(id)));
        steps.put("commit_again", outcome(tc.commitAsync(id)));
        steps.put("abort_after_commit", outcome(tc.abortAsync(id)));
        steps.put("commit_unknown", outcome(tc.commitAsync(unknown)));
        steps.put("abort_unknown", outcome(tc.abortAsync(unknown)));
        // A tcId the client has no handler for never leaves the client.
        steps.put("commit_unknown_tc", outcome(tc.commitAsync(new TxnID(1_000_000L, 1L))));
        Transaction next = client.newTransaction().withTransactionTimeout(60, TimeUnit.SECONDS).build().get();
        steps.put("new_txn_commit", outcome(next.commit()));
        List<Object> after = handlerConnections(client);
        emit(obj("event", "result", "scenario", "tc-errors", "most", id.getMostSigBits(),
                "least", id.getLeastSigBits(), "unknown_least", unknown.getLeastSigBits(),
                "next_most", next.getTxnID().getMostSigBits(), "next_least", next.getTxnID().getLeastSigBits(),
                "steps", steps, "connections_before", before, "connections_after", after));
        close(client);
    }

    /** Commit in a loop until {@code --until-file} exists, on {@code --threads} threads (default 1): one line
     * per transaction, committed or not (the kill and rolling-restart tests read every id). */
    private static void commitLoop(Options o) throws Exception {
        Path until = Path.of(o.required("until-file"));
        long txnTimeoutMs = o.longOpt("txn-timeout-ms", 60_000);
        int threads = o.intOpt("threads", 1);
        long t0 = System.nanoTime();
        PulsarClient client = build(o);
        emit(obj("event", "ready", "build_ms", msSince(t0), "handler_connections", handlerConnections(client)));
        AtomicInteger committed = new AtomicInteger();
        AtomicInteger errors = new AtomicInteger();
        List<Thread> loops = new ArrayList<>(threads);
        for (int i = 0; i < threads; i++) {
            Thread loop = new Thread(() -> {
                try {
                    commitUntil(client, until, txnTimeoutMs, committed, errors);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }, "commit-loop-" + i);
            loop.start();
            loops.add(loop);
        }
        for (Thread loop : loops) {
            loop.join();
        }
        emit(obj("event", "result", "scenario", "commit-loop", "committed", committed.get(), "errors", errors.get(),
                "handler_connections", handlerConnections(client)));
        close(client);
    }

    private static void commitUntil(PulsarClient client, Path until, long txnTimeoutMs, AtomicInteger committed,
                                    AtomicInteger errors) throws InterruptedException {
        while (!Files.exists(until)) {
            long start = System.nanoTime();
            TxnID id = null;
            try {
                Transaction txn = client.newTransaction()
                        .withTransactionTimeout(txnTimeoutMs, TimeUnit.MILLISECONDS).build().get();
                id = txn.getTxnID();
                txn.commit().get();
                committed.incrementAndGet();
                emit(obj("event", "committed", "most", id.getMostSigBits(), "least", id.getLeastSigBits(),
                        "ms", msSince(start), "at", System.currentTimeMillis()));
            } catch (ExecutionException | RuntimeException e) {
                // Anything else the client throws is a failed transaction too, never a thread that ends quietly.
                errors.incrementAndGet();
                emit(obj("event", "error", "stage", id == null ? "open" : "commit",
                        "most", id == null ? null : id.getMostSigBits(),
                        "least", id == null ? null : id.getLeastSigBits(),
                        "error", describe(e), "ms", msSince(start), "at", System.currentTimeMillis()));
                Thread.sleep(100);
            }
        }
    }

    private static void buildOnly(Options o) {
        long t0 = System.nanoTime();
        try {
            PulsarClient client = build(o);
            long elapsed = msSince(t0);
            List<Object> connections = handlerConnections(client);
            emit(obj("event", "result", "scenario", "build-only", "ok", true, "elapsed_ms", elapsed,
                    "coordinators", connections.size()));
            close(client);
        } catch (PulsarClientException | RuntimeException e) {
            emit(obj("event", "result", "scenario", "build-only", "ok", false, "elapsed_ms", msSince(t0),
                    "error", describe(e), "root", describe(rootCause(e))));
        }
    }

    // ---- client plumbing -------------------------------------------------------------------------------

    /** The client every scenario file builds (TxnScenarios, FrontDoorScenarios): transactions on,
     * {@code --op-timeout-ms} (connecting within it too, at most 10 s), the security options (withSecurity). */
    static PulsarClient build(Options o) throws PulsarClientException {
        int opTimeoutMs = (int) o.longOpt("op-timeout-ms", DEFAULT_OP_TIMEOUT_MS);
        ClientBuilder builder = PulsarClient.builder()
                .serviceUrl(o.required("service-url"))
                .enableTransaction(true)
                .operationTimeout(opTimeoutMs, TimeUnit.MILLISECONDS)
                .connectionTimeout(Math.min(opTimeoutMs, 10_000), TimeUnit.MILLISECONDS)
                .statsInterval(0, TimeUnit.SECONDS);
        return withSecurity(builder, o.values()).build();
    }

    /**
     * The security options (tests/security/test_clients.py): {@code --token JWT} (AuthenticationToken),
     * {@code --tls-trust-certs CA.pem} (the CA of a pulsar+ssl:// service URL), {@code --tls-cert} and
     * {@code --tls-key} (AuthenticationTls: mutual TLS, the role is the certificate's CN).
     */
    static ClientBuilder withSecurity(ClientBuilder builder, Map<String, String> options)
            throws PulsarClientException {
        if (options.containsKey("tls-trust-certs")) {
            builder.tlsTrustCertsFilePath(options.get("tls-trust-certs"));
        }
        if (options.containsKey("token")) {
            builder.authentication(AuthenticationFactory.token(options.get("token")));
        } else if (options.containsKey("tls-cert") && options.containsKey("tls-key")) {
            builder.authentication(AuthenticationFactory.TLS(options.get("tls-cert"), options.get("tls-key")));
        }
        return builder;
    }

    static void close(PulsarClient client) {
        try {
            client.closeAsync().get(5, TimeUnit.SECONDS);
        } catch (Exception e) {
            System.err.println("client close: " + e);
        }
    }

    /**
     * The local address of each TC handler's connection, in tcId order (null while a handler has none),
     * read through reflection because the client keeps its handlers private. Equal lists before and after
     * a step prove that the step dropped no connection.
     */
    private static List<Object> handlerConnections(PulsarClient client) {
        List<Object> out = new ArrayList<>();
        try {
            TransactionCoordinatorClientImpl tc = ((PulsarClientImpl) client).getTcClient();
            Field handlersField = TransactionCoordinatorClientImpl.class.getDeclaredField("handlers");
            handlersField.setAccessible(true);
            Object[] handlers = (Object[]) handlersField.get(tc);
            if (handlers == null) {
                return out;
            }
            for (Object handler : handlers) {
                Method cnxMethod = handler.getClass().getDeclaredMethod("cnx");
                cnxMethod.setAccessible(true);
                ClientCnx cnx = (ClientCnx) cnxMethod.invoke(handler);
                out.add(cnx == null || cnx.ctx() == null ? null : String.valueOf(cnx.ctx().channel().localAddress()));
            }
        } catch (ReflectiveOperationException | RuntimeException e) {
            System.err.println("cannot read TC handlers: " + e);
        }
        return out;
    }

    private static Map<String, Object> outcome(CompletableFuture<?> future) {
        long start = System.nanoTime();
        try {
            future.get();
            return obj("outcome", "ok", "ms", msSince(start));
        } catch (ExecutionException | InterruptedException e) {
            return obj("outcome", errorClass(e), "message", errorMessage(e), "ms", msSince(start));
        }
    }

    // ---- output ----------------------------------------------------------------------------------------

    // Package-private: the scenario files of the harness print through the same two helpers.
    static synchronized void emit(Map<String, Object> line) {
        System.out.println(Json.write(line));
        System.out.flush();
    }

    static Map<String, Object> obj(Object... keyValues) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < keyValues.length; i += 2) {
            m.put((String) keyValues[i], keyValues[i + 1]);
        }
        return m;
    }

    static Throwable unwrap(Throwable t) {
        while ((t instanceof ExecutionException || t instanceof CompletionException) && t.getCause() != null) {
            t = t.getCause();
        }
        return t;
    }

    private static Throwable rootCause(Throwable t) {
        while (t.getCause() != null && t.getCause() != t) {
            t = t.getCause();
        }
        return t;
    }

    static String errorClass(Throwable t) {
        return unwrap(t).getClass().getName();
    }

    static String errorMessage(Throwable t) {
        String m = unwrap(t).getMessage();
        return m == null ? "" : (m.length() > 500 ? m.substring(0, 500) : m);
    }

    static Map<String, Object> describe(Throwable t) {
        return obj("class", errorClass(t), "message", errorMessage(t));
    }

    static long msSince(long startNanos) {
        return TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - startNanos);
    }

    /** {@code SCENARIO --key value ...}; every option takes exactly one value. */
    private record Args(String scenario, Options options) {
        static Args parse(String[] argv) {
            if (argv.length == 0) {
                throw new IllegalArgumentException("missing scenario");
            }
            Map<String, String> options = new HashMap<>();
            for (int i = 1; i < argv.length; i += 2) {
                if (!argv[i].startsWith("--") || i + 1 >= argv.length) {
                    throw new IllegalArgumentException("expected --option value at " + argv[i]);
                }
                options.put(argv[i].substring(2), argv[i + 1]);
            }
            return new Args(argv[0], new Options(options));
        }
    }
}
