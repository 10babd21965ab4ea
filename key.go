package leasehold

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// ValidateKey reports whether key is usable: 1 to MaxKeyLen bytes of UTF-8, no
// control characters or whitespace but spaces (else ErrInvalidKey).
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: key is empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: key is %d bytes, the limit is %d", ErrInvalidKey, len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: key %q is not valid UTF-8", ErrInvalidKey, key)
	}
	for i, r := range key {
		if unicode.IsControl(r) || (unicode.IsSpace(r) && r != ' ') {
			return fmt.Errorf("%w: key %q has a control character at byte %d", ErrInvalidKey, key, i)
		}
	}
	return nil
}

// NewToken returns a fresh owner token: 128 random bits, hex-encoded.
func NewToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error (Go 1.24+)
	return hex.EncodeToString(b[:])
}

func tokenPrefix(t string) string {
	if len(t) > 8 {
		return t[:8]
	}
	return t
}
