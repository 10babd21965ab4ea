// Package otelleasehold turns a leasehold Locker's events into OpenTelemetry
// spans. It is a module of its own, so that neither the library nor its
// other adapters pull in OpenTelemetry:
//
//	obs := otelleasehold.New(tracerProvider)
//	locker, err := leasehold.New(store, leasehold.Options{Name: "approval", Observer: obs})
//
// Combine it with the Prometheus adapter with leasehold.ObserverFunc.
//
// Spans (every one with the attributes leasehold.locker and leasehold.key,
// and leasehold.outcome; leasehold.fence once a fence is known):
//
//	leasehold.acquire  TryAcquire, Acquire or Hold, from its start to its outcome
//	                   (acquired, contended, error, fail_open)
//	leasehold.wait     child of leasehold.acquire: from the first attempt that found
//	                   another owner to the outcome; only when the call waited
//	leasehold.renew    a renewal: its round trip when it succeeded (renewed); the
//	                   moment it failed (failed, not_owned), with the attempt number
//	leasehold.release  the holder's release (released), or a release the store
//	                   answered "not owned" or failed (not_owned, error)
//	leasehold.lease    the whole lease, from acquisition to its end, with the
//	                   outcome saying how it ended: released, lost, abandoned,
//	                   expired, max_hold, closed or other
//
// Events carry no context.Context, so the spans are roots of their own traces
// rather than children of the caller's span; leasehold.key and leasehold.fence
// join them to the caller's work. Times come from the events' durations: an
// acquire span starts Duration before its event. The core reports a release
// before its store round trip, and reports nothing when the round trip
// succeeds, so a successful release span marks the moment, not the call.
package otelleasehold
