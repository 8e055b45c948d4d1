package main

// The front-door scenario: the stock Go client with tc-server as its one service URL (transactions
// enabled, so coordinator discovery goes through it as well) producing to and consuming from a real
// broker. The pytest driver (tests/e2e/test_front_door.py) asserts on the result line.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// produceConsume subscribes first (earliest position), sends o.count messages, then receives until
// every one arrived or none came for o.receiveTimeoutMs; it reports duplicates and what is missing.
func produceConsume(o options) error {
	if o.topic == "" {
		return errors.New("-topic is required")
	}
	client, err := newClient(o)
	if err != nil {
		return err
	}
	defer client.Close()
	consumer, err := client.Subscribe(pulsar.ConsumerOptions{
		Topic:                       o.topic,
		SubscriptionName:            o.subscription,
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
	})
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	defer consumer.Close()
	producer, err := client.CreateProducer(pulsar.ProducerOptions{Topic: o.topic, DisableBatching: true})
	if err != nil {
		return fmt.Errorf("create producer: %w", err)
	}
	defer producer.Close()

	sent := make([]string, o.count)
	sendErrs := make(chan error, o.count)
	for i := range o.count {
		sent[i] = fmt.Sprintf("go-%d", i)
		producer.SendAsync(context.Background(), &pulsar.ProducerMessage{Payload: []byte(sent[i])},
			func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) { sendErrs <- err })
	}
	failedSends := 0
	for range o.count {
		if err := <-sendErrs; err != nil {
			failedSends++
		}
	}

	times := map[string]int{}
	partitions := map[string]int{}
	received := 0
	receive := func(wait time.Duration) bool {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		msg, err := consumer.Receive(ctx)
		if err != nil {
			return false
		}
		times[string(msg.Payload())]++
		partitions[msg.Topic()]++
		received++
		_ = consumer.Ack(msg)
		return true
	}
	for received < o.count && receive(time.Duration(o.receiveTimeoutMs)*time.Millisecond) {
	}
	// A short extra wait catches duplicates delivered after the last expected message.
	for receive(500 * time.Millisecond) {
	}
	missing, duplicates := 0, 0
	for _, v := range sent {
		if times[v] == 0 {
			missing++
		}
	}
	for _, n := range times {
		if n > 1 {
			duplicates++
		}
	}
	emit(obj{"event": "result", "scenario": "produce-consume", "topic": o.topic, "sent": o.count,
		"failed_sends": failedSends, "received": received, "distinct": len(times), "duplicates": duplicates,
		"missing": missing, "unexpected": len(times) - (o.count - missing), "partitions": len(partitions)})
	return nil
}
