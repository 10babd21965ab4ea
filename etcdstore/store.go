package etcdstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Sentinel errors.
var (
	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("etcdstore: store closed")
	// ErrInvalidTTL is returned for a TTL that is not positive.
	ErrInvalidTTL = errors.New("etcdstore: invalid TTL")
	// ErrInvalidOptions is returned by New and Open for unusable options.
	ErrInvalidOptions = errors.New("etcdstore: invalid options")
	// ErrUnavailable wraps the error of a request that did not finish within
	// Options.RequestTimeout: no member answered, or the cluster has no
	// quorum or no leader. It matches leasehold.ErrUnavailable (an outage).
	ErrUnavailable = fmt.Errorf("etcdstore: etcd unavailable: %w", leasehold.ErrUnavailable)
)

// DefaultPrefix is the key prefix used when Options.Prefix is empty.
const DefaultPrefix = "leasehold/"

// Options configure a Store. The zero value means the documented defaults.
type Options struct {
	// Prefix is put before every lock key in etcd. Default "leasehold/".
	// Give each application its own prefix, and grant an etcd user access to
	// that prefix only when auth is on.
	Prefix string

	// RequestTimeout bounds each request to etcd from when it is sent; a
	// call it ends fails with ErrUnavailable. A transaction queued behind
	// others of the store (thousands of keys at once) waits while they are
	// answered. Default 1 s (a leader election with etcd's default timing);
	// negative means no bound other than the caller's context.
	RequestTimeout time.Duration
}

// DefaultRequestTimeout is the RequestTimeout used when it is zero.
const DefaultRequestTimeout = time.Second

// Store is a lock store on etcd. It is safe for concurrent use. The zero
// value is not usable: call New or Open, and Close when done.
type Store struct {
	cli     *clientv3.Client
	owned   bool         // Close closes cli (Open dialled it)
	probe   func() error // a plaintext client's probeTLS of its first endpoint (Open); nil for New
	prefix  string
	timeout time.Duration // per request; <= 0: none
	sess    *session
	watches watches
	sights  permitSights // see semaphore.go
	rel     relBatch

	closeOnce sync.Once
}

var (
	_ driver.Store          = (*Store)(nil)
	_ driver.Inspector      = (*Store)(nil)
	_ driver.Notifier       = (*Store)(nil)
	_ driver.ForceReleaser  = (*Store)(nil)
	_ driver.BatchRenewer   = (*Store)(nil)
	_ driver.LiveNotifier   = (*Store)(nil)
	_ driver.Semaphorer     = (*Store)(nil)
	_ driver.PermitNotifier = (*Store)(nil)
	_ driver.PresenceKeeper = (*Store)(nil)
)

// New returns a Store over an existing client. Close revokes the store's
// leases and ends its watches but leaves the client open: it is the
// caller's.
func New(client *clientv3.Client, opts Options) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: client is nil", ErrInvalidOptions)
	}
	if strings.ContainsRune(opts.Prefix, 0) {
		return nil, fmt.Errorf("%w: prefix contains a NUL byte", ErrInvalidOptions)
	}
	s := &Store{cli: client, prefix: cmp.Or(opts.Prefix, DefaultPrefix), timeout: cmp.Or(opts.RequestTimeout, DefaultRequestTimeout)}
	s.sess = newSession(s)
	return s, nil
}

// Close revokes every etcd lease the store granted that may still live
// (which deletes the locks and queue entries still on them), ends the key
// watches and closes the client when the store dialled it (Open). Revoking
// is bounded by two seconds; a lease that could not be revoked expires on
// its own. Close is idempotent.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.sess.cancel() // the key watches end with the session's context
		s.sess.leases.close()
		s.watches.close()
		if s.owned {
			err = s.cli.Close()
		}
	})
	return err
}

// Client returns the etcd client the store uses.
func (s *Store) Client() *clientv3.Client { return s.cli }

// Prefix returns the key prefix.
func (s *Store) Prefix() string { return s.prefix }

// ttlSeconds rounds ttl up to whole seconds, etcd's lease granularity.
func ttlSeconds(ttl time.Duration) (int64, error) {
	if ttl <= 0 {
		return 0, fmt.Errorf("%w: must be > 0, got %v", ErrInvalidTTL, ttl)
	}
	return int64((ttl + time.Second - 1) / time.Second), nil
}

// begin starts an operation: it fails after Close, and bounds ctx by the
// request timeout. Call end when the operation is over.
func (s *Store) begin(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if s.sess.closed() {
		return nil, nil, ErrClosed
	}
	if s.timeout <= 0 {
		return ctx, func() {}, nil
	}
	octx, cancel := context.WithTimeoutCause(context.WithValue(ctx, callerKey{}, ctx), s.timeout, errTimeout)
	return octx, cancel, nil
}

// callerKey is the context value, in an operation's context (begin), of
// its caller's context: without the timeout that begin added.
type callerKey struct{}

// callerOf returns the caller's context of operation context ctx: what a
// transaction queued behind others waits on (relBatch).
func callerOf(ctx context.Context) context.Context {
	if caller, ok := ctx.Value(callerKey{}).(context.Context); ok {
		return caller
	}
	return ctx
}

// errTimeout is the cause of an operation context that hit RequestTimeout.
var errTimeout = errors.New("request timeout")

// Layout (docs/etcd.md): the lock on key K is P+K, a waiter with token T is
// P+K+"\x00"+T, and [P+K, P+K+"\x01") is exactly the lock and its queue.

func (s *Store) lockKey(key string) string { return s.prefix + key }

func (s *Store) entryKey(key, token string) string { return s.prefix + key + "\x00" + token }

// queueRange returns the range of key's queue entries.
func (s *Store) queueRange(key string) (string, string) {
	return s.prefix + key + "\x00", s.prefix + key + "\x01"
}

// keyRange returns the range of key's lock and its queue entries.
func (s *Store) keyRange(key string) (string, string) {
	return s.prefix + key, s.prefix + key + "\x01"
}

// lockValue is a lock key's value: token NUL ttl-in-ms NUL holder, and NUL
// fence (> 0) for a lock written over another. The token comes first: mine.
func lockValue(token string, ttl time.Duration, holder string, fence int64) string {
	v := token + "\x00" + strconv.FormatInt(ttl.Milliseconds(), 10) + "\x00" + holder
	if fence > 0 {
		v += "\x00" + strconv.FormatInt(fence, 10)
	}
	return v
}

// lockFields decodes a lock value. ok is false for a value without a token;
// fence is 0 when the value carries none (the fence is the create revision).
func lockFields(v []byte) (token string, ttl time.Duration, holder string, fence int64, ok bool) {
	tok, rest, _ := strings.Cut(string(v), "\x00")
	ms, rest, _ := strings.Cut(rest, "\x00")
	holder, f, _ := strings.Cut(rest, "\x00")
	if n, err := strconv.ParseInt(ms, 10, 64); err == nil && n > 0 {
		ttl = time.Duration(n) * time.Millisecond
	}
	if n, err := strconv.ParseInt(f, 10, 64); err == nil && n > 0 {
		fence = n
	}
	return tok, ttl, holder, fence, tok != ""
}

// fenceOf returns the fence of a lock key: the one in its value, else its
// create revision.
func fenceOf(kv *mvccpb.KeyValue) uint64 {
	if _, _, _, f, _ := lockFields(kv.Value); f > 0 {
		return uint64(f)
	}
	return uint64(kv.CreateRevision)
}

// entryValue is a queue entry's value: holder NUL ttl-in-ms, the TTL a
// release grants the waiter.
func entryValue(holder string, ttl time.Duration) string {
	return holder + "\x00" + strconv.FormatInt(ttl.Milliseconds(), 10)
}

// entryFields decodes a queue entry's value; ttl is 0 for an entry without
// one (the holder alone, as an earlier version wrote), never granted.
func entryFields(v []byte) (holder string, ttl time.Duration) {
	holder, ms, _ := strings.Cut(string(v), "\x00")
	if n, err := strconv.ParseInt(ms, 10, 64); err == nil && n > 0 {
		ttl = time.Duration(n) * time.Millisecond
	}
	return holder, ttl
}

// mine holds when lock key k's value starts with token+"\x00" (tokens have
// no NUL, so value > token and value < token+"\x01" say exactly that).
func mine(k, token string) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(k), ">", token),
		clientv3.Compare(clientv3.Value(k), "<", token+"\x01"),
	}
}

// checkRequest is checkNames, then a TTL that is not positive.
func checkRequest(key, token, holder string, ttl time.Duration) error {
	if err := checkNames(key, token, holder); err != nil {
		return err
	}
	_, err := ttlSeconds(ttl)
	return err
}

// checkNames rejects a key, token or holder the layout cannot carry.
func checkNames(key, token, holder string) error {
	switch {
	case key == "" || strings.ContainsRune(key, 0):
		return fmt.Errorf("%w: %q (empty or with a NUL byte)", leasehold.ErrInvalidKey, key)
	case token == "" || strings.ContainsRune(token, 0):
		return fmt.Errorf("etcdstore: invalid token %q (empty or with a NUL byte)", token)
	case strings.ContainsRune(holder, 0):
		return fmt.Errorf("etcdstore: invalid holder %q (NUL byte)", holder)
	}
	return nil
}

// ownedBy reports whether lock kv holds token.
func ownedBy(kv *mvccpb.KeyValue, token string) bool {
	tok, _, _, _, _ := lockFields(kv.GetValue()) // "" for nil
	return tok == token
}
