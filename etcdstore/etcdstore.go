package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/leasehold/leasehold"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
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
	// quorum or no leader.
	ErrUnavailable = errors.New("etcdstore: etcd unavailable")
)

// DefaultPrefix is the key prefix used when Options.Prefix is empty.
const DefaultPrefix = "leasehold/"

// Options configure a Store. The zero value means the documented defaults.
type Options struct {
	// Prefix is put before every lock key in etcd. Default "leasehold/".
	// Give each application its own prefix, and grant an etcd user access to
	// that prefix only when auth is on.
	Prefix string

	// RequestTimeout bounds every store operation (Acquire makes up to three
	// etcd requests, List one per lock plus one), so a call
	// fails with ErrUnavailable rather than waiting for its caller's
	// deadline: the etcd client waits for a connection and retries while no
	// member answers, and a Locker must tell a sick store (a store error)
	// apart from its own deadline (contention). Default 1 s, which covers a
	// leader election with etcd's default timing; negative means no bound
	// other than the caller's context.
	RequestTimeout time.Duration
}

// DefaultRequestTimeout is the RequestTimeout used when it is zero.
const DefaultRequestTimeout = time.Second

const (
	revokeQueue   = 1024            // unused leases waiting to be revoked
	revokeTimeout = 2 * time.Second // bound of one background revoke
	drainTimeout  = time.Second     // how long Close keeps revoking
)

// Store is a lock store on etcd. It is safe for concurrent use. The zero
// value is not usable: call New or Open, and Close when done.
type Store struct {
	cli     *clientv3.Client
	owned   bool // Close closes cli (Open dialled it)
	prefix  string
	timeout time.Duration // per request; <= 0: none

	revokes chan clientv3.LeaseID
	stopc   chan struct{} // closed by Close
	donec   chan struct{} // closed when the revoker has exited

	closeOnce sync.Once
}

var (
	_ leasehold.Store         = (*Store)(nil)
	_ leasehold.Notifier      = (*Store)(nil)
	_ leasehold.ForceReleaser = (*Store)(nil)
	_ leasehold.BatchRenewer  = (*Store)(nil)
)

// New returns a Store over an existing client. Close stops the store's
// background goroutine but leaves the client open: it is the caller's.
func New(client *clientv3.Client, opts Options) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: client is nil", ErrInvalidOptions)
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.RequestTimeout == 0 {
		opts.RequestTimeout = DefaultRequestTimeout
	}
	s := &Store{
		cli:     client,
		prefix:  opts.Prefix,
		timeout: opts.RequestTimeout,
		revokes: make(chan clientv3.LeaseID, revokeQueue),
		stopc:   make(chan struct{}),
		donec:   make(chan struct{}),
	}
	go s.revoker()
	return s, nil
}

// Close stops the background revoker (after at most one second spent
// revoking leases still queued; the rest expire on their own) and closes the
// client when the store dialled it (Open). Close is idempotent.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.stopc)
		<-s.donec
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

// revoker revokes leases that no key uses any more: the lease of a lost
// acquire race and of a released lock. They would expire on their own after
// their TTL; revoking them early keeps the lessor small. It runs until Close.
func (s *Store) revoker() {
	defer close(s.donec)
	revoke := func(ctx context.Context, id clientv3.LeaseID) {
		ctx, cancel := context.WithTimeout(ctx, revokeTimeout)
		_, _ = s.cli.Revoke(ctx, id) // best effort: not found or unreachable is fine
		cancel()
	}
	for {
		select {
		case id := <-s.revokes:
			revoke(context.Background(), id)
		case <-s.stopc:
			ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
			defer cancel()
			for ctx.Err() == nil {
				select {
				case id := <-s.revokes:
					revoke(ctx, id)
				default:
					return
				}
			}
			return
		}
	}
}

// revokeLater queues id for the revoker; when the queue is full or the store
// is closing, the lease is left to expire on its own.
func (s *Store) revokeLater(id clientv3.LeaseID) {
	if id == clientv3.NoLease {
		return
	}
	select {
	case <-s.stopc:
	case s.revokes <- id:
	default:
	}
}

func (s *Store) closed() bool {
	select {
	case <-s.stopc:
		return true
	default:
		return false
	}
}

// ttlSeconds rounds ttl up to whole seconds, etcd's lease granularity.
func ttlSeconds(ttl time.Duration) (int64, error) {
	if ttl <= 0 {
		return 0, fmt.Errorf("%w: must be > 0, got %v", ErrInvalidTTL, ttl)
	}
	return int64((ttl + time.Second - 1) / time.Second), nil
}

func wrap(op, key string, err error) error {
	return fmt.Errorf("etcdstore: %s %q: %w", op, key, err)
}

// begin starts an operation: it fails after Close, and bounds ctx by the
// request timeout. Call end when the operation is over.
func (s *Store) begin(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if s.closed() {
		return nil, nil, ErrClosed
	}
	if s.timeout <= 0 {
		return ctx, func() {}, nil
	}
	octx, cancel := context.WithTimeoutCause(ctx, s.timeout, errTimeout)
	return octx, cancel, nil
}

// errTimeout is the cause of an operation context that hit RequestTimeout.
var errTimeout = errors.New("request timeout")

// wrap makes err the error of op on key, marking it ErrUnavailable when the
// request timeout (not the caller's context) ended it.
func (s *Store) wrap(ctx context.Context, op, key string, err error) error {
	if errors.Is(context.Cause(ctx), errTimeout) {
		return fmt.Errorf("etcdstore: %s %q: %w: no answer within %v: %w", op, key, ErrUnavailable, s.timeout, err)
	}
	return wrap(op, key, err)
}

// Acquire implements leasehold.Store in two round trips: LeaseGrant, then
// one transaction that creates the key, or moves our own key (a retry with
// the same token) to the new lease, or reads the other owner's key. On
// contention one more round trip reads the holder's remaining TTL.
func (s *Store) Acquire(ctx context.Context, req leasehold.AcquireRequest) (leasehold.Grant, error) {
	key, token, ttl := req.Key, req.Token, req.TTL
	ctx, end, err := s.begin(ctx)
	if err != nil {
		return leasehold.Grant{}, err
	}
	defer end()
	secs, err := ttlSeconds(ttl)
	if err != nil {
		return leasehold.Grant{}, err
	}
	k := s.prefix + key
	lg, err := s.cli.Grant(ctx, secs)
	if err != nil {
		return leasehold.Grant{}, s.wrap(ctx, "acquire", key, err)
	}
	id := lg.ID
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, token, clientv3.WithLease(id))).
		Else(clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.Value(k), "=", token)},
			[]clientv3.Op{clientv3.OpPut(k, token, clientv3.WithLease(id), clientv3.WithPrevKV())},
			[]clientv3.Op{clientv3.OpGet(k)},
		)).
		Commit()
	if err != nil {
		// The transaction may have applied (lost reply). Revoking the lease
		// then frees a key nobody will use; a retry with the same token
		// either finds the key free or moves it to its own new lease.
		s.revokeLater(id)
		return leasehold.Grant{}, s.wrap(ctx, "acquire", key, err)
	}
	if resp.Succeeded {
		// All puts of a transaction carry its revision, the header's.
		return leasehold.Grant{Fence: uint64(resp.Header.Revision)}, nil
	}
	inner := resp.Responses[0].GetResponseTxn()
	if inner != nil && inner.Succeeded {
		// Our own key, from an acquire whose reply was lost: it now lives on
		// the new lease; the old lease has no key left.
		prev := inner.Responses[0].GetResponsePut().GetPrevKv()
		if prev != nil {
			if old := clientv3.LeaseID(prev.Lease); old != id {
				s.revokeLater(old)
			}
			return leasehold.Grant{Fence: uint64(prev.CreateRevision)}, nil
		}
		// Unreachable: the compare proved the key exists.
		return leasehold.Grant{}, s.wrap(ctx, "acquire", key, errors.New("retry put returned no previous key"))
	}
	s.revokeLater(id)
	var g leasehold.Grant
	if inner != nil && len(inner.Responses) == 1 {
		if kvs := inner.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 && kvs[0].Lease != 0 {
			g.Remaining = s.remaining(ctx, clientv3.LeaseID(kvs[0].Lease))
		}
	}
	return g, leasehold.ErrNotAcquired
}

// remaining returns the time left on lease id, 0 when unknown or expired.
// etcd reports whole seconds, rounded down.
func (s *Store) remaining(ctx context.Context, id clientv3.LeaseID) time.Duration {
	r, err := s.cli.TimeToLive(ctx, id)
	if err != nil || r.TTL <= 0 {
		return 0
	}
	return time.Duration(r.TTL) * time.Second
}

// Renew implements leasehold.Store: a linearizable read checks the token and
// finds the key's lease, then one keep-alive extends it. When the lease was
// granted shorter than ttl (a longer TTL than at acquire), the key moves to a
// new lease of ttl in a transaction that checks token and old lease.
func (s *Store) Renew(ctx context.Context, key, token string, ttl time.Duration) error {
	ctx, end, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer end()
	secs, err := ttlSeconds(ttl)
	if err != nil {
		return err
	}
	k := s.prefix + key
	get, err := s.cli.Get(ctx, k)
	if err != nil {
		return s.wrap(ctx, "renew", key, err)
	}
	if len(get.Kvs) == 0 || string(get.Kvs[0].Value) != token || get.Kvs[0].Lease == 0 {
		return leasehold.ErrNotOwned
	}
	old := clientv3.LeaseID(get.Kvs[0].Lease)
	ka, err := s.cli.KeepAliveOnce(ctx, old)
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return leasehold.ErrNotOwned // it expired between the read and the keep-alive
	case err != nil:
		return s.wrap(ctx, "renew", key, err)
	case ka.TTL >= secs:
		return nil
	}
	lg, err := s.cli.Grant(ctx, secs)
	if err != nil {
		return s.wrap(ctx, "renew", key, err)
	}
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(k), "=", token), clientv3.Compare(clientv3.LeaseValue(k), "=", old)).
		Then(clientv3.OpPut(k, token, clientv3.WithLease(lg.ID))).
		Commit()
	switch {
	case err != nil:
		// If it applied, the key lives on the new lease until its TTL; the
		// old lease (renewed above) expires on its own.
		return s.wrap(ctx, "renew", key, err)
	case !resp.Succeeded:
		s.revokeLater(lg.ID)
		return leasehold.ErrNotOwned
	}
	s.revokeLater(old)
	return nil
}

// maxTxnOps stays under etcd's default --max-txn-ops (128).
const maxTxnOps = 128

// RenewBatch implements leasehold.BatchRenewer: one transaction reads every
// key (token check and lease ID), then the leases are kept alive
// concurrently, so a batch costs two round trips of latency however many
// leases it holds. A request whose TTL grew past its lease's falls back to
// Renew.
func (s *Store) RenewBatch(ctx context.Context, reqs []leasehold.RenewRequest) []error {
	errs := make([]error, len(reqs))
	for start := 0; start < len(reqs); start += maxTxnOps {
		end := min(start+maxTxnOps, len(reqs))
		s.renewChunk(ctx, reqs[start:end], errs[start:end])
	}
	return errs
}

func (s *Store) renewChunk(parent context.Context, reqs []leasehold.RenewRequest, errs []error) {
	ctx, end, err := s.begin(parent)
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return
	}
	defer end()
	secs := make([]int64, len(reqs))
	ops := make([]clientv3.Op, 0, len(reqs))
	at := make([]int, 0, len(reqs)) // ops[j] reads reqs[at[j]]
	for i, r := range reqs {
		if secs[i], errs[i] = ttlSeconds(r.TTL); errs[i] == nil {
			ops = append(ops, clientv3.OpGet(s.prefix+r.Key))
			at = append(at, i)
		}
	}
	if len(ops) == 0 {
		return
	}
	resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		for _, i := range at {
			errs[i] = s.wrap(ctx, "renew", reqs[i].Key, err)
		}
		return
	}
	var wg sync.WaitGroup
	for j, i := range at {
		kvs := resp.Responses[j].GetResponseRange().GetKvs()
		if len(kvs) == 0 || string(kvs[0].Value) != reqs[i].Token || kvs[0].Lease == 0 {
			errs[i] = leasehold.ErrNotOwned
			continue
		}
		id := clientv3.LeaseID(kvs[0].Lease)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ka, err := s.cli.KeepAliveOnce(ctx, id)
			switch {
			case errors.Is(err, rpctypes.ErrLeaseNotFound):
				errs[i] = leasehold.ErrNotOwned // it expired between the read and the keep-alive
			case err != nil:
				errs[i] = s.wrap(ctx, "renew", reqs[i].Key, err)
			case ka.TTL < secs[i]:
				errs[i] = s.Renew(parent, reqs[i].Key, reqs[i].Token, reqs[i].TTL)
			}
		}()
	}
	wg.Wait()
}

// Release implements leasehold.Store: one transaction deletes the key if its
// value is token. The lease is revoked in the background.
func (s *Store) Release(ctx context.Context, key, token string) error {
	ctx, end, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer end()
	k := s.prefix + key
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(k), "=", token)).
		Then(clientv3.OpDelete(k, clientv3.WithPrevKV())).
		Commit()
	if err != nil {
		return s.wrap(ctx, "release", key, err)
	}
	if !resp.Succeeded {
		return leasehold.ErrNotOwned
	}
	for _, kv := range resp.Responses[0].GetResponseDeleteRange().GetPrevKvs() {
		s.revokeLater(clientv3.LeaseID(kv.Lease))
	}
	return nil
}

// ForceRelease implements leasehold.ForceReleaser: it deletes the key
// whoever holds it and revokes its lease.
func (s *Store) ForceRelease(ctx context.Context, key string) (leasehold.LockInfo, error) {
	ctx, end, err := s.begin(ctx)
	if err != nil {
		return leasehold.LockInfo{}, err
	}
	defer end()
	k := s.prefix + key
	resp, err := s.cli.Delete(ctx, k, clientv3.WithPrevKV())
	if err != nil {
		return leasehold.LockInfo{}, s.wrap(ctx, "force release", key, err)
	}
	if len(resp.PrevKvs) == 0 {
		return leasehold.LockInfo{}, leasehold.ErrNotHeld
	}
	kv := resp.PrevKvs[0]
	info := s.info(key, kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease)
	if kv.Lease != 0 {
		info.Remaining = s.remaining(ctx, clientv3.LeaseID(kv.Lease))
		if _, err := s.cli.Revoke(ctx, clientv3.LeaseID(kv.Lease)); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			s.revokeLater(clientv3.LeaseID(kv.Lease))
		}
	}
	info.Facts["forced"] = "deleted key and revoked lease"
	return info, nil
}

func (s *Store) info(key string, etcdKey, value []byte, create, mod, version, lease int64) leasehold.LockInfo {
	return leasehold.LockInfo{
		Key:   key,
		Token: string(value),
		Fence: uint64(create),
		Facts: map[string]string{
			"store":           "etcd",
			"etcd_key":        string(etcdKey),
			"lease":           strconv.FormatInt(lease, 16),
			"create_revision": strconv.FormatInt(create, 10),
			"mod_revision":    strconv.FormatInt(mod, 10),
			"version":         strconv.FormatInt(version, 10),
		},
	}
}

// Inspect implements leasehold.Store: a linearizable read of the key, then
// LeaseTimeToLive for the remaining TTL (whole seconds, rounded down).
func (s *Store) Inspect(ctx context.Context, key string) (leasehold.LockInfo, error) {
	ctx, end, err := s.begin(ctx)
	if err != nil {
		return leasehold.LockInfo{}, err
	}
	defer end()
	get, err := s.cli.Get(ctx, s.prefix+key)
	if err != nil {
		return leasehold.LockInfo{}, s.wrap(ctx, "inspect", key, err)
	}
	if len(get.Kvs) == 0 {
		return leasehold.LockInfo{}, leasehold.ErrNotHeld
	}
	infos, err := s.describe(ctx, get.Kvs[:1])
	if err != nil {
		return leasehold.LockInfo{}, s.wrap(ctx, "inspect", key, err)
	}
	if len(infos) == 0 {
		return leasehold.LockInfo{}, leasehold.ErrNotHeld // its lease just expired
	}
	return infos[0], nil
}

// List implements leasehold.Store: one range read of the prefix (etcd
// returns keys sorted), then one LeaseTimeToLive per lock.
func (s *Store) List(ctx context.Context, prefix string) ([]leasehold.LockInfo, error) {
	ctx, end, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	get, err := s.cli.Get(ctx, s.prefix+prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, s.wrap(ctx, "list", prefix, err)
	}
	infos, err := s.describe(ctx, get.Kvs)
	if err != nil {
		return nil, s.wrap(ctx, "list", prefix, err)
	}
	return infos, nil
}

// describe turns keys into LockInfos with their remaining TTL, leaving out
// keys whose lease has expired (etcd deletes them in a moment).
func (s *Store) describe(ctx context.Context, kvs []*mvccpb.KeyValue) ([]leasehold.LockInfo, error) {
	out := make([]leasehold.LockInfo, 0, len(kvs))
	for _, kv := range kvs {
		info := s.info(string(kv.Key[len(s.prefix):]), kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease)
		if kv.Lease != 0 {
			r, err := s.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				continue
			}
			if err != nil {
				return nil, err
			}
			if r.TTL < 0 {
				continue
			}
			info.Remaining = time.Duration(r.TTL) * time.Second
			info.Facts["lease_ttl"] = strconv.FormatInt(r.GrantedTTL, 10) + "s"
		}
		out = append(out, info)
	}
	return out, nil
}
