package org.tcserver.interop;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.admin.PulsarAdmin;
import org.apache.pulsar.client.admin.PulsarAdminBuilder;
import org.apache.pulsar.client.admin.PulsarAdminException;
import org.apache.pulsar.client.admin.Transactions;
import org.apache.pulsar.client.api.transaction.TxnID;
import org.apache.pulsar.common.policies.data.TransactionCoordinatorInfo;

/**
 * Runs a list of {@code admin.transactions()} calls with the real PulsarAdmin and prints one JSON array: per call
 * {"ok": true, "value": ..., "type": ...} or {"ok": false, "exception": class, "status": code, "message": ...}.
 *
 * <p>Input (stdin, JSON): {"url", "authPlugin", "authParams", "tlsTrustCertsFilePath", "allowTlsInsecureConnection",
 * "enableTlsHostnameVerification", "ops": [{"op": ..., args}]}.
 */
public final class AdminCalls {
    private static final ObjectMapper JSON = new ObjectMapper();

    private AdminCalls() {
    }

    public static void main(String[] args) throws Exception {
        JsonNode config = JSON.readTree(System.in);
        PulsarAdminBuilder builder = PulsarAdmin.builder()
                .serviceHttpUrl(config.get("url").asText())
                .requestTimeout(20, TimeUnit.SECONDS)
                .connectionTimeout(10, TimeUnit.SECONDS)
                .readTimeout(20, TimeUnit.SECONDS);
        if (config.hasNonNull("authPlugin")) {
            builder.authentication(config.get("authPlugin").asText(), config.path("authParams").asText(""));
        }
        if (config.hasNonNull("tlsTrustCertsFilePath")) {
            builder.tlsTrustCertsFilePath(config.get("tlsTrustCertsFilePath").asText());
        }
        if (config.has("allowTlsInsecureConnection")) {
            builder.allowTlsInsecureConnection(config.get("allowTlsInsecureConnection").asBoolean());
        }
        if (config.has("enableTlsHostnameVerification")) {
            builder.enableTlsHostnameVerification(config.get("enableTlsHostnameVerification").asBoolean());
        }
        ArrayNode out = JSON.createArrayNode();
        try (PulsarAdmin admin = builder.build()) {
            Transactions tx = admin.transactions();
            for (JsonNode op : config.get("ops")) {
                ObjectNode result = out.addObject();
                try {
                    Object value = run(tx, op);
                    result.put("ok", true);
                    result.put("type", value == null ? null : value.getClass().getName());
                    if (value instanceof Map<?, ?> map && !map.isEmpty()) {
                        Map.Entry<?, ?> first = map.entrySet().iterator().next();
                        result.put("keyType", first.getKey().getClass().getName());
                        result.put("valueType", first.getValue() == null ? null : first.getValue().getClass().getName());
                    }
                    if (value instanceof List<?> list && !list.isEmpty()) {
                        result.put("valueType", list.get(0).getClass().getName());
                        // TransactionCoordinatorInfo has getters only; say what the client read.
                        if (list.get(0) instanceof TransactionCoordinatorInfo) {
                            ArrayNode infos = result.putArray("value");
                            for (Object each : list) {
                                TransactionCoordinatorInfo info = (TransactionCoordinatorInfo) each;
                                infos.addObject().put("id", info.getId())
                                        .put("brokerServiceUrl", info.getBrokerServiceUrl());
                            }
                            continue;
                        }
                    }
                    result.set("value", JSON.valueToTree(value));
                } catch (PulsarAdminException e) {
                    result.put("ok", false);
                    result.put("exception", e.getClass().getName());
                    result.put("status", e.getStatusCode());
                    result.put("message", e.getMessage());
                    result.put("httpError", e.getHttpError());
                    result.put("cause", e.getCause() == null ? null : e.getCause().toString());
                } catch (RuntimeException e) {
                    result.put("ok", false);
                    result.put("exception", e.getClass().getName());
                    result.put("message", e.getMessage());
                }
            }
        }
        System.out.println(JSON.writeValueAsString(out));
        System.out.flush();
        System.exit(0);
    }

    private static Object run(Transactions tx, JsonNode op) throws PulsarAdminException {
        String name = op.get("op").asText();
        switch (name) {
            case "listCoordinators":
                return tx.listTransactionCoordinators();
            case "coordinatorStats":
                return tx.getCoordinatorStats();
            case "coordinatorStatsById":
                return tx.getCoordinatorStatsById(op.get("id").asInt());
            case "metadata":
                return tx.getTransactionMetadata(new TxnID(op.get("most").asLong(), op.get("least").asLong()));
            case "slow":
                if (op.hasNonNull("coordinatorId")) {
                    return tx.getSlowTransactionsByCoordinatorId(op.get("coordinatorId").asInt(),
                            op.get("timeoutMs").asLong(), TimeUnit.MILLISECONDS);
                }
                return tx.getSlowTransactions(op.get("timeoutMs").asLong(), TimeUnit.MILLISECONDS);
            case "abort":
                tx.abortTransaction(new TxnID(op.get("most").asLong(), op.get("least").asLong()));
                return null;
            case "scale":
                tx.scaleTransactionCoordinators(op.get("replicas").asInt());
                return null;
            case "coordinatorInternalStats":
                return tx.getCoordinatorInternalStats(op.get("id").asInt(), false);
            case "pendingAckStats":
                return tx.getPendingAckStats(op.get("topic").asText(), op.get("sub").asText(), false);
            case "bufferStats":
                return tx.getTransactionBufferStats(op.get("topic").asText(), false, false);
            case "inBufferStats":
                return tx.getTransactionInBufferStats(new TxnID(op.get("most").asLong(), op.get("least").asLong()),
                        op.get("topic").asText());
            case "inPendingAckStats":
                return tx.getTransactionInPendingAckStats(
                        new TxnID(op.get("most").asLong(), op.get("least").asLong()),
                        op.get("topic").asText(), op.get("sub").asText());
            default:
                throw new IllegalArgumentException("unknown op " + name);
        }
    }
}
