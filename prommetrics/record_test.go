package prommetrics_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/prommetrics"
)

// lockedBuffer is a bytes.Buffer safe to read while Record writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func TestRecordAndReadRecording(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		obs, err := prommetrics.New(reg, prommetrics.Options{})
		if err != nil {
			t.Fatal(err)
		}
		obs.Init("approval", "orders")
		var buf lockedBuffer
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		start := time.Now()
		go func() { done <- prommetrics.Record(ctx, reg, &buf, time.Second) }()
		time.Sleep(1500 * time.Millisecond)
		obs.Observe(leasehold.Event{Kind: leasehold.EventStaleWrite, Locker: "approval", Op: "orders"})
		time.Sleep(time.Second)
		obs.Observe(leasehold.Event{Kind: leasehold.EventStaleWrite, Locker: "approval", Op: "orders"})
		cancel() // at 2.5 s: a last scrape
		if err := <-done; err != nil {
			t.Fatalf("Record: %v", err)
		}

		scrapes, err := prommetrics.ReadRecording(bytes.NewReader(buf.b.Bytes()))
		if err != nil {
			t.Fatalf("ReadRecording: %v\n%s", err, buf.b.String())
		}
		// Scrapes at 0, 1 s, 2 s and the last at 2.5 s.
		wantAt := []time.Duration{0, time.Second, 2 * time.Second, 2500 * time.Millisecond}
		wantStale := []float64{0, 0, 1, 2}
		if len(scrapes) != len(wantAt) {
			t.Fatalf("expected %d scrapes, got %d", len(wantAt), len(scrapes))
		}
		for i, s := range scrapes {
			if got := s.Time.Sub(start); got != wantAt[i] {
				t.Errorf("scrape %d at %v, want %v", i, got, wantAt[i])
			}
			vec, err := expfmt.ExtractSamples(&expfmt.DecodeOptions{Timestamp: model.Now()}, s.Families...)
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, smp := range vec {
				if smp.Timestamp.Time().UnixMilli() != s.Time.UnixMilli() {
					t.Errorf("scrape %d: sample %v has timestamp %v", i, smp.Metric, smp.Timestamp)
				}
				if smp.Metric["__name__"] == "leasehold_stale_writes_rejected_total" {
					found = true
					if float64(smp.Value) != wantStale[i] {
						t.Errorf("scrape %d: stale writes %v, want %v", i, smp.Value, wantStale[i])
					}
				}
			}
			if !found {
				t.Errorf("scrape %d has no stale-write series (Init should create it at 0)", i)
			}
		}
		if !strings.Contains(buf.b.String(), "# leasehold-scrape ") {
			t.Errorf("expected scrape marker lines")
		}
	})
}

func TestRecordValidatesAndReportsWriteErrors(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := prommetrics.Record(t.Context(), reg, &bytes.Buffer{}, 0); !errors.Is(err, prommetrics.ErrInvalidOptions) {
		t.Fatalf("expected ErrInvalidOptions for interval 0, got %v", err)
	}
	if err := prommetrics.Record(t.Context(), reg, failWriter{}, time.Second); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("expected the write error, got %v", err)
	}
	if _, err := prommetrics.ReadRecording(strings.NewReader("leasehold_x 1\n")); err == nil {
		t.Fatal("expected an error for samples before the first scrape line")
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }
