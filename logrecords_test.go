package leasehold_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/memstore"
)

// Acquire and release write Debug records with the key, the token prefix,
// the fence and the holder, so an operator can find a holder by its token
// prefix in the logs (issue 16: no record named the token at acquire).
func TestDebugRecordsAtAcquireAndRelease(t *testing.T) {
	var buf bytes.Buffer
	l, err := leasehold.New(memstore.New(), leasehold.Options{
		Name: "approval", Identity: "worker-7",
		Logger: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lease, err := l.TryAcquire(t.Context(), "invoice/7")
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"leasehold: lease acquired": false, "leasehold: lease released": false}
	for line := range strings.Lines(buf.String()) {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		msg, _ := r["msg"].(string)
		if _, ok := want[msg]; !ok {
			continue
		}
		want[msg] = true
		if r["level"] != "DEBUG" || r["key"] != "invoice/7" || r["holder"] != "worker-7" || r["locker"] != "approval" ||
			r["token"] != lease.Token()[:8] || r["fence"] != float64(lease.Fence()) {
			t.Errorf("%s: unexpected attributes %v (token %s, fence %d)", msg, r, lease.Token()[:8], lease.Fence())
		}
	}
	for msg, seen := range want {
		if !seen {
			t.Errorf("no %q record in:\n%s", msg, buf.String())
		}
	}
}
