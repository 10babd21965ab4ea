package pgstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/pgstore"
)

// RenewBatch answers each request as Renew would, also when two requests
// name one key: the holder's renewal is nil, the other token's ErrNotOwned.
func TestRenewBatchSameKeyTwoTokens(t *testing.T) {
	_, dsn := fresh(t)
	s := open(t, dsn, pgstore.Options{})
	ctx := ctx5(t)
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "holder", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	for _, reqs := range [][]driver.RenewRequest{
		{{Key: "k", Token: "holder", TTL: time.Minute}, {Key: "k", Token: "other", TTL: time.Minute}},
		{{Key: "k", Token: "other", TTL: time.Minute}, {Key: "k", Token: "holder", TTL: time.Minute}},
	} {
		errs := s.RenewBatch(ctx, reqs)
		for i, r := range reqs {
			if r.Token == "holder" && errs[i] != nil {
				t.Errorf("RenewBatch %v: the holder's renewal: expected nil, got %v", reqs, errs[i])
			}
			if r.Token == "other" && !errors.Is(errs[i], leasehold.ErrNotOwned) {
				t.Errorf("RenewBatch %v: another token's renewal: expected ErrNotOwned, got %v", reqs, errs[i])
			}
		}
	}
}
