package cli

import (
	"github.com/leasehold/leasehold"

	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// quoteUnprintable returns s as it is when it is valid UTF-8 and every rune
// of it is printable, and Go-quoted otherwise, so that a key, token or
// holder identity written into the store by anyone can never send terminal
// escapes (ESC sequences, OSC window titles, a screen clear; a lone byte
// 0x9b is CSI to a terminal that takes 8-bit controls) to an operator's
// terminal.
func quoteUnprintable(s string) string {
	if s != "" && utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) < 0 && !strings.HasPrefix(s, `"`) {
		return s
	}
	return strconv.Quote(s)
}

// operatorKey reads the KEY argument of inspect and release. A Go-quoted key
// ("\x1b[2J…", as ls and inspect print keys with unprintable characters) is
// unquoted and taken as it is, so an operator can inspect and force-release a
// key that the library itself would never have written; a plain key must be
// a valid key.
func operatorKey(arg string) (string, error) {
	if strings.HasPrefix(arg, `"`) {
		key, err := strconv.Unquote(arg)
		switch {
		case err != nil:
			return "", usage("KEY %s starts with a quote but is not a Go-quoted string: %v", arg, err)
		case key == "" || len(key) > leasehold.MaxKeyLen:
			return "", usage("KEY must be 1 to %d bytes, got %d", leasehold.MaxKeyLen, len(key))
		}
		return key, nil
	}
	if err := leasehold.ValidateKey(arg); err != nil {
		return "", usage("%v", err)
	}
	return arg, nil
}
