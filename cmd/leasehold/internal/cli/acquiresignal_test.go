package cli

import (
	"context"
	"os"
	"syscall"
	"testing"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/memstore"
)

// A signal that arrives while the acquire is being granted is reported
// with the lease, so that run gives the lease back instead of starting the
// command with the signal lost.
func TestAcquireOrSignalReportsASignalThatRacedTheGrant(t *testing.T) {
	locker, err := leasehold.New(memstore.New(), leasehold.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close()
	sigs := make(chan os.Signal, 1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	lease, sig, err := acquireOrSignal(ctx, cancel, sigs, func(ctx context.Context) (*leasehold.Lease, error) {
		sigs <- syscall.SIGTERM
		<-ctx.Done()                                        // the signal was seen
		return locker.TryAcquire(context.Background(), "k") // granted all the same
	})
	if err != nil || lease == nil {
		t.Fatalf("expected the grant returned, got %v, %v", lease, err)
	}
	defer lease.Release(context.Background())
	if sig != syscall.SIGTERM {
		t.Errorf("expected the signal that raced the grant reported, got %v", sig)
	}
}
