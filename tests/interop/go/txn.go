package main

// The transactional produce scenario: the stock Go client commits (or aborts) messages produced in one
// transaction through its service URL (tc-server in front of a real broker, or the broker itself). The
// pytest driver (tests/e2e/test_transactions.py) asserts on the result line.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// txnProduce subscribes first (earliest position), sends o.count messages in one txn, reports what the
// consumer sees before the end (bounded wait), ends the txn with o.action, then reports what arrives
// and whether a plain message sent afterwards to every partition arrives (no read horizon left pinned).
func txnProduce(o options) error {
	if o.topic == "" {
		return errors.New("-topic is required")
	}
	if o.action != "commit" && o.action != "abort" {
		return fmt.Errorf("-action must be commit or abort, not %q", o.action)
	}
	client, err := newClient(o)
	if err != nil {
		return err
	}
	defer client.Close()
	partitions, err := client.TopicPartitions(o.topic)
	if err != nil {
		return fmt.Errorf("partitions of %s: %w", o.topic, err)
	}
	consumer, err := client.Subscribe(pulsar.ConsumerOptions{
		Topic:                       o.topic,
		SubscriptionName:            "tc-e2e-go",
		Type:                        pulsar.Shared,
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
	})
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	defer consumer.Close()
	// The client refuses transactional sends while a send timeout is set (-1 disables it).
	producer, err := client.CreateProducer(pulsar.ProducerOptions{Topic: o.topic, DisableBatching: true,
		SendTimeout: -1})
	if err != nil {
		return fmt.Errorf("create producer: %w", err)
	}
	defer producer.Close()

	txn, err := client.NewTransaction(time.Duration(o.txnTimeoutMs) * time.Millisecond)
	if err != nil {
		return fmt.Errorf("new transaction: %w", err)
	}
	id := txn.GetTxnID()
	ctx := context.Background()
	for i := range o.count {
		if _, err := producer.Send(ctx, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("txn-%d", i)),
			Transaction: txn}); err != nil {
			return fmt.Errorf("transactional send %d: %w", i, err)
		}
	}
	receive := func(wait time.Duration) (string, bool) {
		rctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		msg, err := consumer.Receive(rctx)
		if err != nil {
			return "", false
		}
		_ = consumer.Ack(msg)
		return string(msg.Payload()), true
	}
	// Bounded: "nothing within 2 s" while the txn is open.
	visibleBefore := []string{}
	for v, ok := receive(2 * time.Second); ok; v, ok = receive(2 * time.Second) {
		visibleBefore = append(visibleBefore, v)
	}

	end := txn.Commit
	if o.action == "abort" {
		end = txn.Abort
	}
	endCtx, cancel := context.WithTimeout(ctx, time.Duration(o.opTimeoutMs)*time.Millisecond)
	endErr := end(endCtx)
	cancel()

	wait := time.Duration(o.receiveTimeoutMs) * time.Millisecond
	afterEnd := []string{}
	if o.action == "commit" {
		for len(afterEnd) < o.count {
			v, ok := receive(wait)
			if !ok {
				break
			}
			afterEnd = append(afterEnd, v)
		}
	}
	markers := []string{}
	for p, partition := range partitions {
		plain, err := client.CreateProducer(pulsar.ProducerOptions{Topic: partition, DisableBatching: true})
		if err != nil {
			return fmt.Errorf("create producer for %s: %w", partition, err)
		}
		marker := fmt.Sprintf("plain-%d", p)
		_, err = plain.Send(ctx, &pulsar.ProducerMessage{Payload: []byte(marker)})
		plain.Close()
		if err != nil {
			return fmt.Errorf("plain send to %s: %w", partition, err)
		}
		markers = append(markers, marker)
	}
	missing := map[string]bool{}
	for _, m := range markers {
		missing[m] = true
	}
	withMarkers := []string{}
	for len(missing) > 0 {
		v, ok := receive(wait)
		if !ok {
			break
		}
		withMarkers = append(withMarkers, v)
		delete(missing, v)
	}
	emit(obj{"event": "result", "scenario": "txn-produce", "action": o.action, "most": id.MostSigBits,
		"least": id.LeastSigBits, "count": o.count, "partitions": len(partitions),
		"end": obj{"outcome": outcome(endErr), "message": message(endErr)},
		"visible_before_end": visibleBefore, "received_after_end": afterEnd, "markers_sent": markers,
		"received_with_markers": withMarkers})
	return nil
}
