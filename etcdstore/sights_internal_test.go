package etcdstore

import (
	"strconv"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// A store that sees more than maxSights holder keys within a holder's TTL
// keeps that holder's sight: its TTL still ends by when it was first seen,
// so a takeover of it is not put off. Sights of keys gone for longer than
// their TTL and sightStale are dropped, so the map stays bounded.
func TestSightsOfPresentHoldersOutliveMaxSights(t *testing.T) {
	holder := func(key string, mod int64, ttl time.Duration) []*mvccpb.KeyValue {
		return []*mvccpb.KeyValue{{Key: []byte(key), ModRevision: mod, Value: []byte(lockValue("", ttl, "h", 0))}}
	}
	var ps permitSights
	at := time.Unix(1_700_000_000, 0)
	want := ps.ends(holder("sem/h/dead", 7, 10*time.Second), at)[0] // stops renewing: its key stays at mod 7
	others := func(round int) {
		for i := range 2 * maxSights { // permits of a second that came and went
			at = at.Add(time.Second / (2 * maxSights))
			ps.ends(holder("sem/h/"+strconv.Itoa(round)+"-"+strconv.Itoa(i), int64(i), time.Second), at)
		}
	}
	others(0)
	if got := ps.ends(holder("sem/h/dead", 7, 10*time.Second), at)[0]; !got.Equal(want) {
		t.Fatalf("the present holder's TTL after %d other sights: expected it to end at %v (first sight + TTL), got %v", 2*maxSights, want, got)
	}
	for round := 1; round <= 3; round++ {
		at = at.Add(time.Second + sightStale) // the holders seen before are gone
		others(round)
		if n := len(ps.m); n > 4*maxSights {
			t.Fatalf("round %d: expected at most %d sights, got %d", round, 4*maxSights, n)
		}
	}
}
