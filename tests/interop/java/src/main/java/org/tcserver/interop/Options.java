package org.tcserver.interop;

import java.util.Map;

/** A scenario's {@code --key value} options, as TcInterop parsed them (every scenario file reads them so). */
record Options(Map<String, String> values) {
    String required(String name) {
        String v = values.get(name);
        if (v == null) {
            throw new IllegalArgumentException("--" + name + " is required");
        }
        return v;
    }

    String get(String name, String dflt) {
        return values.getOrDefault(name, dflt);
    }

    long longOpt(String name, long dflt) {
        String v = values.get(name);
        return v == null ? dflt : Long.parseLong(v);
    }

    int intOpt(String name, int dflt) {
        String v = values.get(name);
        return v == null ? dflt : Integer.parseInt(v);
    }

    /** {@code --receive-timeout-ms} (default 30000): how long a consumer waits for the next message. */
    int receiveTimeoutMs() {
        return intOpt("receive-timeout-ms", 30_000);
    }
}
