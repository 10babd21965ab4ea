package cli

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/leasehold/leasehold"
)

// storeSays keeps the store's words and drops what the message around it
// says already.
func TestStoreSays(t *testing.T) {
	wrongpass := errors.New("WRONGPASS invalid username-password pair or user is disabled.")
	for _, tt := range []struct {
		desc string
		err  error
		want string
	}{
		{"redis://:xxxxx@h:1", &leasehold.StoreError{Op: "acquire", Key: "job:7", Err: fmt.Errorf("redisstore: acquire %q: %w: %w", "job:7", leasehold.ErrMisconfigured, wrongpass)},
			"WRONGPASS invalid username-password pair or user is disabled"},
		{"redis://h:1", fmt.Errorf("redisstore: inspect %q: %w", `a "quoted" key`, errors.New("EOF (is this a Redis server? ...)")),
			"EOF (is this a Redis server? ...)"},
		{"etcd://h:1", fmt.Errorf("storeurl: store unavailable: %s does not answer: %w", "etcd://h:1", errors.New("context deadline exceeded")),
			"does not answer: context deadline exceeded"},
		{"postgres://u:xxxxx@h:1/db", fmt.Errorf("storeurl: store unavailable: %s: pgstore: connect: %w", "postgres://u:xxxxx@h:1/db", errors.New("connection refused")),
			"connect: connection refused"},
		{"etcd://h:1", errors.New("EOF"), "EOF"},
	} {
		got := storeSays(tt.desc, tt.err)
		if !strings.HasPrefix(got, tt.want) || strings.Contains(got, "leasehold:") || strings.Contains(got, "store:") {
			t.Errorf("storeSays(%q, %q): expected %q, got %q", tt.desc, tt.err, tt.want, got)
		}
	}
}
