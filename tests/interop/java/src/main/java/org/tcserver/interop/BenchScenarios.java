package org.tcserver.interop;

import static org.tcserver.interop.TcInterop.emit;
import static org.tcserver.interop.TcInterop.obj;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.transaction.Transaction;

/**
 * Load scenarios for benchmarks (tc_server/bench/vs_pulsar.py drives them against tc-server and against
 * Pulsar's own coordinator); they measure, they assert nothing.
 *
 * <pre>
 *   pair-bench --concurrency C --duration-ms D [--warmup-ms W] [--txn-timeout-ms T]
 *       C threads, each a closed loop of newTransaction().build().get() then commit().get() (NEW_TXN +
 *       END_TXN, no produce); the first W ms are not counted. Prints {"event":"measure-start"} when the
 *       counted window opens, {"event":"measure-end"} when it closes (so the driver can read the servers'
 *       CPU time across exactly that window), then one {"event":"result"} line with pairs/s and the
 *       pair latency percentiles in ms.
 * </pre>
 */
final class BenchScenarios {
    private static final int MAX_ERROR_SAMPLES = 5;

    private BenchScenarios() {
    }

    static void pairBench(String serviceUrl, int concurrency, long durationMs, long warmupMs, long txnTimeoutMs)
            throws Exception {
        PulsarClient client = PulsarClient.builder()
                .serviceUrl(serviceUrl)
                .enableTransaction(true)
                .operationTimeout(30, TimeUnit.SECONDS)
                .statsInterval(0, TimeUnit.SECONDS)
                .build();
        long start = System.nanoTime();
        long measureFrom = start + TimeUnit.MILLISECONDS.toNanos(warmupMs);
        long measureUntil = measureFrom + TimeUnit.MILLISECONDS.toNanos(durationMs);
        AtomicLong errors = new AtomicLong();
        List<String> errorSamples = new ArrayList<>();
        List<Loop> loops = new ArrayList<>(concurrency);
        for (int i = 0; i < concurrency; i++) {
            Loop loop = new Loop(client, txnTimeoutMs, measureFrom, measureUntil, errors, errorSamples);
            loops.add(loop);
            loop.thread.start();
        }
        sleepUntil(measureFrom);
        emit(obj("event", "measure-start"));
        sleepUntil(measureUntil);
        emit(obj("event", "measure-end"));
        for (Loop loop : loops) {
            loop.thread.join();
        }
        int total = 0;
        for (Loop loop : loops) {
            total += loop.pairNanos.size();
        }
        long[] pairs = new long[total];
        long[] news = new long[total];
        int at = 0;
        for (Loop loop : loops) {
            for (int i = 0; i < loop.pairNanos.size(); i++) {
                pairs[at] = loop.pairNanos.get(i);
                news[at] = loop.newNanos.get(i);
                at++;
            }
        }
        Arrays.sort(pairs);
        Arrays.sort(news);
        double seconds = durationMs / 1000.0;
        emit(obj("event", "result", "scenario", "pair-bench", "concurrency", concurrency,
                "duration_ms", durationMs, "pairs", total, "errors", errors.get(), "error_samples", errorSamples,
                "pairs_per_s", total / seconds,
                "pair_p50_ms", percentileMs(pairs, 50), "pair_p99_ms", percentileMs(pairs, 99),
                "pair_p999_ms", percentileMs(pairs, 99.9), "new_p50_ms", percentileMs(news, 50),
                "new_p99_ms", percentileMs(news, 99)));
        try {
            client.closeAsync().get(5, TimeUnit.SECONDS);
        } catch (Exception e) {
            System.err.println("client close: " + e);
        }
    }

    /** One closed loop on its own thread; keeps the pairs that started inside the counted window. */
    private static final class Loop implements Runnable {
        final Thread thread = new Thread(this, "pair-bench");
        final List<Long> pairNanos = new ArrayList<>();
        final List<Long> newNanos = new ArrayList<>();
        private final PulsarClient client;
        private final long txnTimeoutMs;
        private final long measureFrom;
        private final long measureUntil;
        private final AtomicLong errors;
        private final List<String> errorSamples;

        Loop(PulsarClient client, long txnTimeoutMs, long measureFrom, long measureUntil, AtomicLong errors,
             List<String> errorSamples) {
            this.client = client;
            this.txnTimeoutMs = txnTimeoutMs;
            this.measureFrom = measureFrom;
            this.measureUntil = measureUntil;
            this.errors = errors;
            this.errorSamples = errorSamples;
        }

        @Override
        public void run() {
            while (true) {
                long t0 = System.nanoTime();
                if (t0 >= measureUntil) {
                    return;
                }
                try {
                    Transaction txn = client.newTransaction()
                            .withTransactionTimeout(txnTimeoutMs, TimeUnit.MILLISECONDS).build().get();
                    long t1 = System.nanoTime();
                    txn.commit().get();
                    long t2 = System.nanoTime();
                    // Only pairs that started and finished inside the counted window count.
                    if (t0 >= measureFrom && t2 <= measureUntil) {
                        pairNanos.add(t2 - t0);
                        newNanos.add(t1 - t0);
                    }
                } catch (ExecutionException | InterruptedException e) {
                    errors.incrementAndGet();
                    synchronized (errorSamples) {
                        if (errorSamples.size() < MAX_ERROR_SAMPLES) {
                            Throwable cause = e.getCause() == null ? e : e.getCause();
                            errorSamples.add(cause.getClass().getName() + ": " + cause.getMessage());
                        }
                    }
                    if (e instanceof InterruptedException) {
                        return;
                    }
                }
            }
        }
    }

    private static double percentileMs(long[] sorted, double p) {
        if (sorted.length == 0) {
            return Double.NaN;
        }
        int index = (int) Math.min(sorted.length - 1, (long) (sorted.length * p / 100));
        return sorted[index] / 1e6;
    }

    private static void sleepUntil(long nanoTime) throws InterruptedException {
        long left;
        while ((left = nanoTime - System.nanoTime()) > 0) {
            TimeUnit.NANOSECONDS.sleep(left);
        }
    }
}
