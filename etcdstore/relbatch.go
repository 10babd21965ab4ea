package etcdstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A key's transactions (Store.txn) go alone while fewer than
// maxRelInFlight requests are in flight; beyond that they queue, and when a
// request returns the first queued one sends the queue as one transaction of
// nested ones (at most maxRelBatch, one per key): K keys at once cost
// K/maxRelBatch requests (docs/etcd.md). etcd's --max-txn-ops (default 128)
// bounds the outer transaction's ops plus those of each nested level below
// it: a batch of 128 keys is refused ("too many operations"), hence 100.
// RequestTimeout bounds each request from when it is sent, not the wait in
// the queue: 10,000 keys at once are 100 requests, 2 at a time, answered
// over seconds by a healthy cluster. A request it ends fails the queue too.
const (
	maxRelInFlight = 2
	maxRelBatch    = 100
)

// relBatch is the queue of transactions.
type relBatch struct {
	mu       sync.Mutex
	queue    []*relCall
	inFlight int // requests sent (alone or batched) and not answered
}

// busy reports whether a full batch waits in the queue: etcd is the
// bottleneck, and every transaction saved shortens the wait of the others.
func (b *relBatch) busy() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue) >= maxRelBatch
}

// relCall is one transaction and, once done is closed, its answer; lead:
// done was closed to make it send the queue instead.
type relCall struct {
	key       string
	cmps      []clientv3.Cmp
	then, els []clientv3.Op
	done      chan struct{}
	first     bool // queued at the front
	lead      bool
	header    *etcdserverpb.ResponseHeader
	succeeded bool
	responses []*etcdserverpb.ResponseOp
	err       error
}

// sendFunc sends the calls of one request (a batch or one call alone) and
// sets their answers (or a call's own error); ctx bounds it.
type sendFunc func(ctx context.Context, calls []*relCall) error

// requestFunc returns the context of a request sent now for the operation
// of ctx: bounded by RequestTimeout from now (cause errTimeout), and ending
// with the operation's caller unless detached (a batch carries others).
type requestFunc func(ctx context.Context, detached bool) (context.Context, context.CancelFunc)

// do sends c alone, or queues it until a request carries it or it is its
// turn to send the queue, detached. Queued, it waits as long as the
// requests ahead are answered; it returns the caller's error when the
// caller's context (callerOf) ends first (c may have applied).
func (b *relBatch) do(ctx context.Context, c *relCall, send sendFunc, request requestFunc) error {
	b.mu.Lock()
	if b.inFlight < maxRelInFlight {
		b.inFlight++
		b.mu.Unlock()
		return b.send(ctx, []*relCall{c}, send, request, false)
	}
	c.done = make(chan struct{}) // only a queued call is answered through it
	if c.first {
		b.queue = slices.Insert(b.queue, 0, c)
	} else {
		b.queue = append(b.queue, c)
	}
	b.mu.Unlock()
	caller := callerOf(ctx)
	select {
	case <-c.done:
	case <-caller.Done():
		b.mu.Lock()
		if i := slices.Index(b.queue, c); i >= 0 { // not sent: leave the queue
			b.queue = slices.Delete(b.queue, i, i+1)
			b.mu.Unlock()
			return caller.Err()
		}
		lead := c.lead
		b.mu.Unlock()
		if lead { // our turn came: pass it on
			b.next(false)
			return caller.Err()
		}
		select {
		case <-c.done: // answered meanwhile
			return c.err
		default: // in a request in flight: its answer is lost to us
			return caller.Err()
		}
	}
	if !c.lead {
		return c.err
	}
	// Our turn: send the queue (we were taken out of it), with us first.
	b.mu.Lock()
	batch, keys := []*relCall{c}, map[string]bool{c.key: true}
	rest := b.queue[:0] // one pass: the queue can hold thousands
	for _, q := range b.queue {
		// The same key twice in one transaction: etcd refuses it; next time.
		if len(batch) < maxRelBatch && !keys[q.key] {
			keys[q.key] = true
			batch = append(batch, q)
			continue
		}
		rest = append(rest, q)
	}
	clear(b.queue[len(rest):])
	b.queue = rest
	b.mu.Unlock()
	return b.send(ctx, batch, send, request, true)
}

// send sends the calls of one request, under a context of its own (detached
// when it carries others' calls), and answers the calls after the first.
func (b *relBatch) send(ctx context.Context, batch []*relCall, send sendFunc, request requestFunc, detached bool) error {
	rctx, cancel := request(ctx, detached)
	defer cancel()
	err := send(rctx, batch)
	for _, q := range batch[1:] {
		if err != nil {
			q.err = err
		}
		close(q.done)
	}
	b.next(errors.Is(context.Cause(rctx), errTimeout))
	return cmp.Or(err, batch[0].err) // a call's own error, when send set it
}

// errStalled is the error of the calls queued behind a request that
// RequestTimeout ended.
var errStalled = fmt.Errorf("%w: a request ahead of this one in the store's queue had no answer within the request timeout", ErrUnavailable)

// next is called when a request in flight was answered, or a queued call
// passes its turn on: the first queued call (if any) gets the turn to send
// the queue, and the request's slot. After a request that RequestTimeout
// ended (stalled), every queued call fails: the cluster does not answer.
func (b *relBatch) next(stalled bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if stalled {
		for _, q := range b.queue {
			q.err = errStalled
			close(q.done)
		}
		b.queue = nil
	}
	if len(b.queue) == 0 {
		b.inFlight--
		return
	}
	n := b.queue[0]
	b.queue = b.queue[1:]
	n.lead = true
	close(n.done)
}

// txn commits If(cmps).Then(then).Else(els), whose writes are all within
// key's range, alone or batched with other keys' (relBatch; at the front of
// its queue when first). The answer's header is the request's: a batch
// writes at one revision, so a write's revision is still the header's.
func (s *Store) txn(ctx context.Context, key string, cmps []clientv3.Cmp, then, els []clientv3.Op, first bool) (*clientv3.TxnResponse, error) {
	c := &relCall{key: key, cmps: cmps, then: then, els: els, first: first}
	if err := s.rel.do(ctx, c, s.sendTxns, s.request); err != nil {
		return nil, err
	}
	return &clientv3.TxnResponse{Header: c.header, Succeeded: c.succeeded, Responses: c.responses}, nil
}

// sendTxns is the Store's sendFunc: one call is a plain transaction,
// several are nested in one, or go one by one when etcd refused them for a
// lease gone (an acquire's, queued past it), so that only its call fails.
func (s *Store) sendTxns(ctx context.Context, calls []*relCall) error {
	if len(calls) == 1 {
		c := calls[0]
		resp, err := s.cli.Txn(ctx).If(c.cmps...).Then(c.then...).Else(c.els...).Commit()
		if err != nil {
			return err
		}
		c.header, c.succeeded, c.responses = resp.Header, resp.Succeeded, resp.Responses
		return nil
	}
	ops := make([]clientv3.Op, len(calls))
	for i, c := range calls {
		ops[i] = clientv3.OpTxn(c.cmps, c.then, c.els)
	}
	resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
	if errors.Is(err, rpctypes.ErrLeaseNotFound) { // a call queued past its lease: it alone fails
		for _, c := range calls {
			c.err = s.sendTxns(ctx, []*relCall{c})
		}
		return nil
	}
	if err != nil {
		return err
	}
	for i, c := range calls {
		inner := resp.Responses[i].GetResponseTxn()
		c.header, c.succeeded, c.responses = resp.Header, inner.GetSucceeded(), inner.GetResponses()
	}
	return nil
}

// request is the Store's requestFunc.
func (s *Store) request(ctx context.Context, detached bool) (context.Context, context.CancelFunc) {
	parent := callerOf(ctx)
	if detached {
		parent = context.WithoutCancel(ctx)
	}
	switch {
	case s.timeout > 0:
		return context.WithTimeoutCause(parent, s.timeout, errTimeout)
	case detached: // no timeout: a batch ends at Close
		return context.WithCancel(s.sess.ctx)
	}
	return context.WithCancel(parent)
}
