package drill

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a goroutine-safe progress sink.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// The drill says what it is doing while it runs (issue 16: it printed
// nothing until the end): replicas starting, each fault starting and ending
// with the replicas' progress, and the check.
func TestProgressLines(t *testing.T) {
	var out lockedBuffer
	if _, err := Run(t.Context(), Config{TTL: 300 * time.Millisecond, Jobs: 12, Faults: []Fault{FaultCrash}, Progress: &out}); err != nil {
		t.Fatal(err)
	}
	got := out.b.String()
	for _, want := range []string{"replicas working on 12 jobs", "fault crash starts", "fault crash ended after", "acquisitions", "checking the history"} {
		if !strings.Contains(got, want) {
			t.Errorf("expected a progress line with %q, got:\n%s", want, got)
		}
	}
}
