// Command tc-interop-go runs one scenario of the official Go client (apache/pulsar-client-go) against a
// transaction coordinator and prints JSON lines on stdout: zero or more "event" lines, then one
// "event":"result" line. The pytest driver (tests/interop/test_go.py) owns every assertion.
//
//	tc-interop-go SCENARIO -service-url pulsar://127.0.0.1:6650 [flags]
//	  concurrent  -count N                 open N txns at once, commit the even ones, abort the odd ones
//	  timeout     -txn-timeout-ms T -sleep-ms S   let a txn time out, then commit it
//	  ends        end-state errors the Go API can reach: commit twice, abort after commit
//	  commit-loop -until-file F            open+commit in a loop, one line per commit, until F exists
//	  build-only                           build a client and report how long it took
//	  txn-produce -topic T -count N -action commit|abort   N messages in one txn, then consumed (txn.go)
//	  produce-consume -topic T -count N    N messages through a front-door tc-server (frontdoor.go)
//
// The Go client hides its coordinator client, so unlike the Java harness it cannot send END_TXN for an
// id of its choosing: Transaction.Commit/Abort check the client-side state first.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	pulsarlog "github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/sirupsen/logrus"
)

type options struct {
	serviceURL   string
	token        string // -token JWT: AuthenticationToken (tests/security/test_clients.py)
	opTimeoutMs  int
	count        int
	txnTimeoutMs int
	sleepMs      int
	untilFile    string
	// produce-consume (frontdoor.go)
	topic            string
	subscription     string
	receiveTimeoutMs int
	action           string // txn-produce (txn.go): commit or abort
}

type obj = map[string]any

var emitMu sync.Mutex

// emit writes one JSON line; encoding/json sorts map keys, which keeps lines diffable.
func emit(line obj) {
	emitMu.Lock()
	defer emitMu.Unlock()
	b, err := json.Marshal(line)
	if err != nil {
		b, _ = json.Marshal(obj{"event": "fatal", "error": err.Error()})
	}
	_, _ = os.Stdout.Write(append(b, '\n'))
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: tc-interop-go SCENARIO -service-url URL [flags]")
		os.Exit(2)
	}
	scenario := os.Args[1]
	fs := flag.NewFlagSet(scenario, flag.ExitOnError)
	var o options
	fs.StringVar(&o.serviceURL, "service-url", "", "pulsar://host:port of the coordinator")
	fs.StringVar(&o.token, "token", "", "authenticate with this JWT (AuthenticationToken)")
	fs.IntVar(&o.opTimeoutMs, "op-timeout-ms", 10_000, "client OperationTimeout")
	fs.IntVar(&o.count, "count", 1000, "concurrent: number of transactions")
	fs.IntVar(&o.txnTimeoutMs, "txn-timeout-ms", 60_000, "transaction timeout")
	fs.IntVar(&o.sleepMs, "sleep-ms", 3_000, "timeout: how long to wait before committing")
	fs.StringVar(&o.untilFile, "until-file", "", "commit-loop: stop when this file exists")
	fs.StringVar(&o.topic, "topic", "", "produce-consume: the topic")
	fs.StringVar(&o.subscription, "subscription", "front-door-go", "produce-consume: the subscription")
	fs.IntVar(&o.receiveTimeoutMs, "receive-timeout-ms", 30_000, "produce-consume: wait this long for the next message")
	fs.StringVar(&o.action, "action", "commit", "txn-produce: commit or abort")
	_ = fs.Parse(os.Args[2:])
	if o.serviceURL == "" {
		fmt.Fprintln(os.Stderr, "-service-url is required")
		os.Exit(2)
	}

	var err error
	switch scenario {
	case "concurrent":
		err = concurrent(o)
	case "timeout":
		err = timeoutScenario(o)
	case "ends":
		err = ends(o)
	case "commit-loop":
		err = commitLoop(o)
	case "build-only":
		buildOnly(o)
	case "txn-produce":
		err = txnProduce(o)
	case "produce-consume":
		err = produceConsume(o)
	default:
		fmt.Fprintln(os.Stderr, "unknown scenario:", scenario)
		os.Exit(2)
	}
	if err != nil {
		emit(obj{"event": "fatal", "scenario": scenario, "error": describe(err)})
		os.Exit(1)
	}
}

func newClient(o options) (pulsar.Client, error) {
	logger := logrus.New()
	logger.SetOutput(os.Stderr)
	logger.SetLevel(logrus.WarnLevel)
	opTimeout := time.Duration(o.opTimeoutMs) * time.Millisecond
	options := pulsar.ClientOptions{
		URL:               o.serviceURL,
		EnableTransaction: true,
		OperationTimeout:  opTimeout,
		ConnectionTimeout: min(opTimeout, 10*time.Second),
		Logger:            pulsarlog.NewLoggerWithLogrus(logger),
	}
	if o.token != "" {
		options.Authentication = pulsar.NewAuthenticationToken(o.token)
	}
	return pulsar.NewClient(options)
}

func concurrent(o options) error {
	t0 := time.Now()
	client, err := newClient(o)
	if err != nil {
		return err
	}
	defer client.Close()
	buildMs := time.Since(t0).Milliseconds()
	txnTimeout := time.Duration(o.txnTimeoutMs) * time.Millisecond

	txns := make([]pulsar.Transaction, o.count)
	openErrs := make([]error, o.count)
	t1 := time.Now()
	var wg sync.WaitGroup
	for i := range o.count {
		wg.Add(1)
		go func() {
			defer wg.Done()
			txns[i], openErrs[i] = client.NewTransaction(txnTimeout)
		}()
	}
	wg.Wait()
	openMs := time.Since(t1).Milliseconds()

	lines := make([]obj, o.count)
	t2 := time.Now()
	for i := range o.count {
		if openErrs[i] != nil {
			lines[i] = obj{"event": "txn", "index": i, "action": "open", "most": nil, "least": nil,
				"outcome": errClass(openErrs[i]), "message": openErrs[i].Error()}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(o.opTimeoutMs)*time.Millisecond)
			defer cancel()
			action, end := "commit", txns[i].Commit
			if i%2 == 1 {
				action, end = "abort", txns[i].Abort
			}
			id := txns[i].GetTxnID()
			lines[i] = obj{"event": "txn", "index": i, "most": id.MostSigBits, "least": id.LeastSigBits,
				"action": action, "outcome": outcome(end(ctx))}
		}()
	}
	wg.Wait()
	endMs := time.Since(t2).Milliseconds()
	failed := 0
	for _, line := range lines {
		if line["outcome"] != "ok" {
			failed++
		}
		emit(line)
	}
	emit(obj{"event": "result", "scenario": "concurrent", "count": o.count, "failed": failed,
		"build_ms": buildMs, "open_ms": openMs, "end_ms": endMs})
	return nil
}

func timeoutScenario(o options) error {
	client, err := newClient(o)
	if err != nil {
		return err
	}
	defer client.Close()
	txn, err := client.NewTransaction(time.Duration(o.txnTimeoutMs) * time.Millisecond)
	if err != nil {
		return err
	}
	id := txn.GetTxnID()
	time.Sleep(time.Duration(o.sleepMs) * time.Millisecond)
	stateBefore := txn.GetState()
	// The Go client moves the txn to TxnTimeout on its own timer and then refuses Commit locally.
	start := time.Now()
	commitErr := txn.Commit(context.Background())
	emit(obj{"event": "result", "scenario": "timeout", "most": id.MostSigBits, "least": id.LeastSigBits,
		"txn_timeout_ms": o.txnTimeoutMs, "sleep_ms": o.sleepMs,
		"state_before_commit": stateName(stateBefore), "state_after_commit": stateName(txn.GetState()),
		"commit": obj{"outcome": outcome(commitErr), "message": message(commitErr),
			"ms": time.Since(start).Milliseconds()}})
	return nil
}

func ends(o options) error {
	client, err := newClient(o)
	if err != nil {
		return err
	}
	defer client.Close()
	ctx := context.Background()
	step := func(f func(context.Context) error) obj {
		start := time.Now()
		err := f(ctx)
		return obj{"outcome": outcome(err), "message": message(err), "ms": time.Since(start).Milliseconds()}
	}
	txn, err := client.NewTransaction(time.Minute)
	if err != nil {
		return err
	}
	other, err := client.NewTransaction(time.Minute)
	if err != nil {
		return err
	}
	steps := obj{
		"commit":             step(txn.Commit),
		"commit_again":       step(txn.Commit),
		"abort_after_commit": step(txn.Abort),
		"abort":              step(other.Abort),
		"abort_again":        step(other.Abort),
	}
	id, otherID := txn.GetTxnID(), other.GetTxnID()
	emit(obj{"event": "result", "scenario": "ends", "most": id.MostSigBits, "least": id.LeastSigBits,
		"other_most": otherID.MostSigBits, "other_least": otherID.LeastSigBits, "steps": steps,
		"state": stateName(txn.GetState()), "other_state": stateName(other.GetState())})
	return nil
}

func commitLoop(o options) error {
	if o.untilFile == "" {
		return errors.New("-until-file is required")
	}
	t0 := time.Now()
	client, err := newClient(o)
	if err != nil {
		return err
	}
	defer client.Close()
	emit(obj{"event": "ready", "build_ms": time.Since(t0).Milliseconds()})
	txnTimeout := time.Duration(o.txnTimeoutMs) * time.Millisecond
	committed, failures := 0, 0
	for {
		if _, err := os.Stat(o.untilFile); err == nil {
			break
		}
		start := time.Now()
		txn, err := client.NewTransaction(txnTimeout)
		if err != nil {
			failures++
			emit(obj{"event": "error", "stage": "open", "error": describe(err), "ms": time.Since(start).Milliseconds(),
				"at": time.Now().UnixMilli()})
			time.Sleep(100 * time.Millisecond)
			continue
		}
		id := txn.GetTxnID()
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(o.opTimeoutMs)*time.Millisecond)
		err = txn.Commit(ctx)
		cancel()
		if err != nil {
			failures++
			emit(obj{"event": "error", "stage": "commit", "most": id.MostSigBits, "least": id.LeastSigBits,
				"error": describe(err), "ms": time.Since(start).Milliseconds(), "at": time.Now().UnixMilli()})
			time.Sleep(100 * time.Millisecond)
			continue
		}
		committed++
		emit(obj{"event": "committed", "most": id.MostSigBits, "least": id.LeastSigBits,
			"ms": time.Since(start).Milliseconds(), "at": time.Now().UnixMilli()})
	}
	emit(obj{"event": "result", "scenario": "commit-loop", "committed": committed, "errors": failures})
	return nil
}

func buildOnly(o options) {
	t0 := time.Now()
	client, err := newClient(o)
	elapsed := time.Since(t0).Milliseconds()
	if err != nil {
		emit(obj{"event": "result", "scenario": "build-only", "ok": false, "elapsed_ms": elapsed,
			"error": describe(err)})
		return
	}
	client.Close()
	emit(obj{"event": "result", "scenario": "build-only", "ok": true, "elapsed_ms": elapsed})
}

// ---- error reporting --------------------------------------------------------------------------------

var resultNames = map[pulsar.Result]string{
	pulsar.InvalidStatus:                    "InvalidStatus",
	pulsar.TransactionNoFoundError:          "TransactionNoFoundError",
	pulsar.TimeoutError:                     "TimeoutError",
	pulsar.ConnectError:                     "ConnectError",
	pulsar.LookupError:                      "LookupError",
	pulsar.UnknownError:                     "UnknownError",
	pulsar.TransactionCoordinatorNotEnabled: "TransactionCoordinatorNotEnabled",
	pulsar.MaxConcurrentOperationsReached:   "MaxConcurrentOperationsReached",
}

// errClass names an error the way the driver compares it: the pulsar.Result name for client errors
// ("pulsar.Error/InvalidStatus"), the Go type otherwise.
func errClass(err error) string {
	var pe *pulsar.Error
	if errors.As(err, &pe) {
		if name, ok := resultNames[pe.Result()]; ok {
			return "pulsar.Error/" + name
		}
		return fmt.Sprintf("pulsar.Error/Result(%d)", pe.Result())
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "context.DeadlineExceeded"
	}
	return fmt.Sprintf("%T", err)
}

func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	return errClass(err)
}

func message(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func describe(err error) obj {
	return obj{"class": errClass(err), "message": err.Error()}
}

func stateName(s pulsar.TxnState) string {
	names := map[pulsar.TxnState]string{
		pulsar.TxnOpen: "OPEN", pulsar.TxnCommitting: "COMMITTING", pulsar.TxnAborting: "ABORTING",
		pulsar.TxnCommitted: "COMMITTED", pulsar.TxnAborted: "ABORTED", pulsar.TxnError: "ERROR",
		pulsar.TxnTimeout: "TIME_OUT",
	}
	if n, ok := names[s]; ok {
		return n
	}
	return fmt.Sprintf("State(%d)", s)
}
