package redisstore

import (
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
)

// misconfigured lists the Redis error prefixes that retrying cannot fix:
// credentials, permissions, key types, cross-slot names, a database that
// does not exist, a server without a command the store needs.
var misconfigured = []string{"WRONGPASS", "NOAUTH", "NOPERM", "WRONGTYPE", "CROSSSLOT"}

// misconfiguredText matches errors whose prefix is the generic ERR.
var misconfiguredText = []string{
	"DB index is out of range", "invalid DB index", "unknown command", "Unknown Redis command",
	"can't run this command", "no permissions to", "NOPERM",
}

// fail wraps an error of op on key: ErrBadEntry for an entry the scripts
// cannot use (BADENTRY, WRONGTYPE), ErrMisconfigured for configuration
// errors. The Locker wraps the result in a *StoreError.
func (s *Store) fail(op, key string, err error) error {
	switch {
	case redis.HasErrorPrefix(err, "BADENTRY"):
		return fmt.Errorf("redisstore: %s %q: %w: %s (delete the named Redis key to recover: its next fence comes from the server clock)",
			op, key, leasehold.ErrBadEntry, strings.TrimPrefix(scriptError(err), "BADENTRY "))
	case redis.HasErrorPrefix(err, "WRONGTYPE"):
		return fmt.Errorf("redisstore: %s %q: %w: %w: %w (a Redis key under %s{...} holds another type: delete it or use another Prefix)",
			op, key, leasehold.ErrMisconfigured, leasehold.ErrBadEntry, err, s.prefix)
	case strings.Contains(err.Error(), "unauthenticated"):
		return fmt.Errorf("redisstore: %s %q: %w: %w (the server requires a password)", op, key, leasehold.ErrMisconfigured, err)
	case isMisconfigured(err):
		return fmt.Errorf("redisstore: %s %q: %w: %w", op, key, leasehold.ErrMisconfigured, err)
	}
	return fmt.Errorf("redisstore: %s %q: %w", op, key, err)
}

func isMisconfigured(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	for _, p := range misconfigured {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	msg := rerr.Error()
	for _, m := range misconfiguredText {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// isEntryError reports an error that concerns one entry, not the store.
func isEntryError(err error) bool {
	return redis.HasErrorPrefix(err, "BADENTRY") || redis.HasErrorPrefix(err, "WRONGTYPE")
}

// scriptError returns a script's error message without Redis's " script: …"
// suffix.
func scriptError(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, " script: "); i >= 0 {
		return msg[:i]
	}
	return msg
}
