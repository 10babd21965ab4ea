// Package prommetrics exports a leasehold Locker's events as Prometheus
// metrics. It lives apart from the core so that importing leasehold does not
// pull in client_golang:
//
//	reg := prometheus.NewRegistry()
//	obs, err := prommetrics.New(reg, prommetrics.Options{})
//	...
//	locker, err := leasehold.New(store, leasehold.Options{Name: "approval", Observer: obs})
//
// Every series is labelled by locker, the Locker's Name (a small fixed set,
// one per risk class), never by key: 10,000 keys make no more series than
// one. Label values are bounded: an Op outside the known set is counted as
// "other", and locker names (and locker/resource pairs of stale writes) past
// Options.MaxLockers as locker="other".
//
// Series (with the default namespace):
//
//	leasehold_acquire_wait_seconds{locker,result}       histogram; result: acquired|contended|error
//	leasehold_held_seconds{locker,reason}               histogram; reason: released|lost|abandoned|expired|max_hold|closed|other
//	leasehold_renew_seconds{locker}                     histogram of successful renewal round trips
//	leasehold_contention_total{locker}                  store or in-process attempts that found another owner
//	leasehold_fail_open_total{locker}                   store failures turned into degraded, local-only leases
//	leasehold_renewal_failures_total{locker}            failed automatic renewal attempts
//	leasehold_abandoned_total{locker}                   leases abandoned after the renewal failure budget
//	leasehold_lost_total{locker}                        leases the store said another owner holds
//	leasehold_expired_total{locker}                     leases cancelled by the local expiry guard
//	leasehold_max_hold_total{locker}                    leases that reached MaxHold
//	leasehold_renewals_behind_total{locker}             reports that renewals are sent later than half their slack before the local guard (EventRenewalBehind, at most one per RenewInterval)
//	leasehold_not_owned_total{locker,op}                release or renew answered "not owned"; op: release|renew|other
//	leasehold_store_errors_total{locker,op}             store failures; op: acquire|renew|release|inspect|list|other
//	leasehold_stale_writes_rejected_total{locker,resource}  writes rejected at a fenced boundary (package fence)
//	leasehold_leases_held{locker}                       gauge of leases held now (acquired or failed open, not yet ended), permits included
//	leasehold_permits_held{locker}                      gauge of semaphore permits held now (a subset of leases_held)
//	leasehold_permits_waiting{locker}                   gauge of Semaphore.Acquire calls waiting in a key's queue now
//	leasehold_store_config_warnings{locker,check}       gauge: 1 when the locker's one check of its store found a setting that can lose locks (check: redis_eviction|pg_durability|other)
//
// Every series of a locker starts at zero the first time the locker is seen.
// The first time is often the first event itself (a store error, a rejected
// write), and a counter whose first sample is 1 never shows in increase() or
// rate(): call Init at startup with each locker name and fenced resource, so
// the series exist at zero before anything happens and alerts count the first
// event.
//
// Record writes timestamped scrapes of a registry to a file while a short
// process runs (`leasehold drill --record-metrics`), and ReadRecording reads
// them back, to replay them through the alert rules or backfill a Prometheus.
//
// A Hold lease (Locker.Hold, Locker.Loop) that is not renewed ends by expiry
// on purpose: it shows as leasehold_held_seconds{reason="expired"} but not in
// leasehold_expired_total, which counts only renewed leases whose local expiry
// guard fired.
//
// deploy/prometheus/alerts.yml holds alert rules over these series,
// deploy/grafana/leasehold.json a dashboard and docs/runbook.md the runbook.
package prommetrics

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leasehold/leasehold"
)

// ErrInvalidOptions is returned by New for options that cannot work.
var ErrInvalidOptions = errors.New("prommetrics: invalid options")

// Fixed label values.
var (
	// Results are the values of the result label.
	Results = []string{leasehold.ResultAcquired, leasehold.ResultContended, leasehold.ResultError}
	// Reasons are the values of the reason label of leasehold_held_seconds.
	Reasons = []string{"released", "lost", "abandoned", "expired", "max_hold", "closed", OtherLabel}
	// NotOwnedOps are the values of the op label of leasehold_not_owned_total.
	NotOwnedOps = []string{"release", "renew", OtherLabel}
	// StoreOps are the values of the op label of leasehold_store_errors_total.
	StoreOps = []string{"acquire", "renew", "release", "inspect", "list", OtherLabel}
	// ConfigChecks are the values of the check label of
	// leasehold_store_config_warnings.
	ConfigChecks = []string{"redis_eviction", "pg_durability", OtherLabel}
)

// reasonErrs maps a lease's end cause to Reasons[i]; anything else is "other".
var reasonErrs = []error{
	leasehold.ErrLeaseReleased, leasehold.ErrLeaseLost, leasehold.ErrLeaseAbandoned,
	leasehold.ErrLeaseExpired, leasehold.ErrMaxHoldReached, leasehold.ErrLockerClosed,
}

// Observer is a leasehold.Observer that updates Prometheus metrics. It is
// safe for concurrent use; once a locker's series exist, Observe does not
// allocate for its lock events.
type Observer struct {
	acquireWait   *prometheus.HistogramVec
	held          *prometheus.HistogramVec
	renew         *prometheus.HistogramVec
	contention    *prometheus.CounterVec
	failOpen      *prometheus.CounterVec
	renewFailures *prometheus.CounterVec
	abandoned     *prometheus.CounterVec
	lost          *prometheus.CounterVec
	expired       *prometheus.CounterVec
	maxHold       *prometheus.CounterVec
	behind        *prometheus.CounterVec
	notOwned      *prometheus.CounterVec
	storeErrors   *prometheus.CounterVec
	misconfigured *prometheus.CounterVec
	staleWrites   *prometheus.CounterVec
	leasesHeld    *prometheus.GaugeVec
	permitsHeld   *prometheus.GaugeVec
	permitsWait   *prometheus.GaugeVec
	configWarns   *prometheus.GaugeVec

	lockers   bounded[lockerSeries]
	resources bounded[prometheus.Counter]
}

var _ leasehold.Observer = (*Observer)(nil)

// lockerSeries are one locker's resolved series, so Observe needs no label
// lookups.
type lockerSeries struct {
	acquire       [3]prometheus.Observer // by Results
	heldFor       [7]prometheus.Observer // by Reasons
	renew         prometheus.Observer
	contention    prometheus.Counter
	failOpen      prometheus.Counter
	renewFailures prometheus.Counter
	abandoned     prometheus.Counter
	lost          prometheus.Counter
	expired       prometheus.Counter
	maxHold       prometheus.Counter
	behind        prometheus.Counter
	notOwned      [3]prometheus.Counter // by NotOwnedOps
	storeErrors   [6]prometheus.Counter // by StoreOps
	misconfigured prometheus.Counter
	leasesHeld    prometheus.Gauge
	permitsHeld   prometheus.Gauge
	permitsWait   prometheus.Gauge
	configWarns   [3]prometheus.Gauge // by ConfigChecks
}

// New returns an Observer whose metrics are registered with reg (e.g.
// prometheus.DefaultRegisterer or a prometheus.NewRegistry()). It returns an
// error wrapping ErrInvalidOptions for bad options, and the registry's error
// when a metric of the same name is already registered (one Observer per
// namespace and registry; share it between lockers).
func New(reg prometheus.Registerer, opts Options) (*Observer, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: Registerer is nil; pass prometheus.DefaultRegisterer or a registry", ErrInvalidOptions)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	hist := func(name, help string, b []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: o.Namespace, Name: name, Help: help, Buckets: b, ConstLabels: o.ConstLabels,
		}, append([]string{"locker"}, labels...))
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: o.Namespace, Name: name, Help: help, ConstLabels: o.ConstLabels,
		}, append([]string{"locker"}, labels...))
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: o.Namespace, Name: name, Help: help, ConstLabels: o.ConstLabels,
		}, append([]string{"locker"}, labels...))
	}
	m := &Observer{
		acquireWait: hist("acquire_wait_seconds",
			"Time from the start of TryAcquire, Acquire or Hold to its outcome, by result (acquired, contended, error).",
			o.WaitBuckets, "result"),
		held: hist("held_seconds",
			"Time leases were held, from acquisition to their end, by how they ended.",
			o.HeldBuckets, "reason"),
		renew: hist("renew_seconds",
			"Round trip of successful lease renewals.", o.RenewBuckets),
		contention: counter("contention_total",
			"Acquire attempts that found the key held by another owner (in this process or another)."),
		failOpen: counter("fail_open_total",
			"Store failures on acquire turned into degraded, local-only leases by the fail-open policy: cross-replica races were possible."),
		renewFailures: counter("renewal_failures_total",
			"Failed automatic renewal attempts."),
		abandoned: counter("abandoned_total",
			"Leases abandoned after the renewal failure budget: the store could not be reached."),
		lost: counter("lost_total",
			"Leases the store said are no longer ours (expired or taken by another owner)."),
		expired: counter("expired_total",
			"Leases cancelled by the local expiry guard: the TTL ran out since the last successful renewal."),
		maxHold: counter("max_hold_total",
			"Leases that reached the locker's maximum hold time."),
		behind: counter("renewals_behind_total",
			"Reports that automatic renewals are sent later than half their slack before the local expiry guard: the store or the process serves fewer renewals than the leases need, and leases expire if it lasts."),
		notOwned: counter("not_owned_total",
			"Releases and renewals answered \"lock not owned\", by operation.", "op"),
		storeErrors: counter("store_errors_total",
			"Failures of the lock store, by operation.", "op"),
		misconfigured: counter("store_misconfigured_total",
			"Store failures that are configuration errors (wrong password, missing permission, wrong key type, cross-slot keys, missing schema): never failed open; fix the configuration."),
		staleWrites: counter("stale_writes_rejected_total",
			"Writes rejected at a fenced boundary because their fence was older than the last accepted one, by resource.", "resource"),
		leasesHeld: gauge("leases_held",
			"Leases held now: acquired (or failed open) and not yet ended; semaphore permits included."),
		permitsHeld: gauge("permits_held",
			"Semaphore permits held now: acquired (or failed open) and not yet ended."),
		permitsWait: gauge("permits_waiting",
			"Semaphore acquisitions waiting in a key's queue now."),
		configWarns: gauge("store_config_warnings",
			"1 when the locker's one check of its store's settings found one that can lose locks without an error, by check (see leasehold doctor).", "check"),
	}
	for _, c := range []prometheus.Collector{
		m.acquireWait, m.held, m.renew, m.contention, m.failOpen, m.renewFailures, m.abandoned,
		m.lost, m.expired, m.maxHold, m.behind, m.notOwned, m.storeErrors, m.misconfigured, m.staleWrites,
		m.leasesHeld,
		m.permitsHeld, m.permitsWait, m.configWarns,
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("prommetrics: register metrics: %w", err)
		}
	}
	m.lockers = bounded[lockerSeries]{max: o.MaxLockers, make: m.newLockerSeries}
	m.resources = bounded[prometheus.Counter]{max: o.MaxLockers, make: func(pair string) *prometheus.Counter {
		locker, resource, _ := strings.Cut(pair, "\x00")
		if pair == OverflowLocker {
			locker, resource = OverflowLocker, OverflowLocker
		}
		c := m.staleWrites.WithLabelValues(locker, resource)
		return &c
	}}
	return m, nil
}

func (m *Observer) newLockerSeries(name string) *lockerSeries {
	s := &lockerSeries{
		renew:         m.renew.WithLabelValues(name),
		contention:    m.contention.WithLabelValues(name),
		failOpen:      m.failOpen.WithLabelValues(name),
		renewFailures: m.renewFailures.WithLabelValues(name),
		abandoned:     m.abandoned.WithLabelValues(name),
		lost:          m.lost.WithLabelValues(name),
		expired:       m.expired.WithLabelValues(name),
		maxHold:       m.maxHold.WithLabelValues(name),
		behind:        m.behind.WithLabelValues(name),
		misconfigured: m.misconfigured.WithLabelValues(name),
		leasesHeld:    m.leasesHeld.WithLabelValues(name),
		permitsHeld:   m.permitsHeld.WithLabelValues(name),
		permitsWait:   m.permitsWait.WithLabelValues(name),
	}
	for i, r := range Results {
		s.acquire[i] = m.acquireWait.WithLabelValues(name, r)
	}
	for i, r := range Reasons {
		s.heldFor[i] = m.held.WithLabelValues(name, r)
	}
	for i, op := range NotOwnedOps {
		s.notOwned[i] = m.notOwned.WithLabelValues(name, op)
	}
	for i, op := range StoreOps {
		s.storeErrors[i] = m.storeErrors.WithLabelValues(name, op)
	}
	for i, c := range ConfigChecks {
		s.configWarns[i] = m.configWarns.WithLabelValues(name, c)
	}
	return s
}

// Init creates, at zero, every series of the locker named locker and the
// stale-write counter of each of its fenced resources (the Name and Resource
// of a fence register), so that the first event of each kind moves a series
// that already exists and increase() and rate() see it. Call it at startup
// for every locker name the process uses; names past Options.MaxLockers
// share the "other" series, as in Observe.
func (m *Observer) Init(locker string, resources ...string) {
	m.lockers.get(locker)
	for _, r := range resources {
		m.resources.get(orUnknown(locker) + "\x00" + orUnknown(r))
	}
}

// Observe implements leasehold.Observer. Events of kinds it does not know,
// and EventAcquire with an unknown Result, are ignored.
func (m *Observer) Observe(e leasehold.Event) {
	switch e.Kind {
	case leasehold.EventStaleWrite:
		(*m.resources.get(orUnknown(e.Locker) + "\x00" + orUnknown(e.Op))).Inc()
		return
	case leasehold.EventAcquire, leasehold.EventContention, leasehold.EventFailOpen,
		leasehold.EventRenewed, leasehold.EventRenewFailed, leasehold.EventAbandoned,
		leasehold.EventLost, leasehold.EventExpired, leasehold.EventMaxHold,
		leasehold.EventNotOwned, leasehold.EventHeld, leasehold.EventStoreError,
		leasehold.EventPermitWaiting, leasehold.EventPermitWaitEnded, leasehold.EventConfigWarning,
		leasehold.EventRenewalBehind:
	default:
		// EventReleased is counted through EventHeld{reason="released"};
		// other kinds are unknown to this version.
		return
	}
	s := m.lockers.get(e.Locker)
	if !s.lifecycle(e) {
		s.count(e)
	}
}

// lifecycle records the events that start and end leases, permits and
// waits, and reports whether e was one of them.
func (s *lockerSeries) lifecycle(e leasehold.Event) bool {
	switch e.Kind {
	case leasehold.EventAcquire:
		if i := index(Results, e.Result); i >= 0 {
			s.acquire[i].Observe(seconds(e))
		}
		if e.Result == leasehold.ResultAcquired {
			s.held(e, 1)
		}
	case leasehold.EventFailOpen:
		s.failOpen.Inc()
		s.held(e, 1)
	case leasehold.EventHeld:
		s.heldFor[reasonIndex(e.Err)].Observe(seconds(e))
		s.held(e, -1)
	case leasehold.EventPermitWaiting:
		s.permitsWait.Inc()
	case leasehold.EventPermitWaitEnded:
		s.permitsWait.Dec()
	default:
		return false
	}
	return true
}

// count records the other events.
func (s *lockerSeries) count(e leasehold.Event) {
	switch e.Kind {
	case leasehold.EventContention:
		s.contention.Inc()
	case leasehold.EventRenewed:
		s.renew.Observe(seconds(e))
	case leasehold.EventRenewFailed:
		s.renewFailures.Inc()
	case leasehold.EventAbandoned:
		s.abandoned.Inc()
	case leasehold.EventLost:
		s.lost.Inc()
	case leasehold.EventExpired:
		s.expired.Inc()
	case leasehold.EventMaxHold:
		s.maxHold.Inc()
	case leasehold.EventRenewalBehind:
		s.behind.Inc()
	case leasehold.EventNotOwned:
		s.notOwned[opIndex(NotOwnedOps, e.Op)].Inc()
	case leasehold.EventConfigWarning:
		s.configWarns[opIndex(ConfigChecks, e.Op)].Set(1)
	case leasehold.EventStoreError:
		s.storeErrors[opIndex(StoreOps, e.Op)].Inc()
		if errors.Is(e.Err, leasehold.ErrMisconfigured) {
			s.misconfigured.Inc()
		}
	}
}

// held moves the held gauges by d for the lease (or permit) of e.
func (s *lockerSeries) held(e leasehold.Event, d float64) {
	s.leasesHeld.Add(d)
	if e.Permit {
		s.permitsHeld.Add(d)
	}
}

// Reason returns the reason label for a lease that ended with cause err:
// one of Reasons.
func Reason(err error) string { return Reasons[reasonIndex(err)] }

func reasonIndex(err error) int {
	for i, target := range reasonErrs {
		if errors.Is(err, target) {
			return i
		}
	}
	return len(Reasons) - 1
}

func orUnknown(name string) string {
	if name == "" {
		return "unknown"
	}
	return name
}

func seconds(e leasehold.Event) float64 {
	return max(e.Duration.Seconds(), 0)
}

func index(set []string, v string) int {
	for i, s := range set {
		if s == v {
			return i
		}
	}
	return -1
}

// opIndex maps op to its index in set, whose last element is "other".
func opIndex(set []string, op string) int {
	if i := index(set, op); i >= 0 {
		return i
	}
	return len(set) - 1
}

// bounded maps label values to their series, creating them on first sight,
// up to max distinct values; later values share the OverflowLocker entry.
type bounded[T any] struct {
	max  int
	make func(name string) *T

	m  sync.Map // string -> *T
	mu sync.Mutex
	n  int
}

func (b *bounded[T]) get(name string) *T {
	name = orUnknown(name)
	if v, ok := b.m.Load(name); ok {
		return v.(*T)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if v, ok := b.m.Load(name); ok {
		return v.(*T)
	}
	if b.n >= b.max {
		name = OverflowLocker
		if v, ok := b.m.Load(name); ok {
			return v.(*T)
		}
	} else {
		b.n++
	}
	t := b.make(name)
	b.m.Store(name, t)
	return t
}
