package cli

import (
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/spf13/pflag"
)

// logOptions are the global --log-format and --log-level flags.
type logOptions struct {
	format choice // text or json
	level  choice // debug, info, warn, error; "" = warn (info with -v)
}

// register adds the flags to the root's persistent flags.
func (l *logOptions) register(pf *pflag.FlagSet) {
	l.format = choice{value: "text", allowed: []string{"text", "json"}}
	l.level = choice{allowed: []string{"debug", "info", "warn", "error"}}
	pf.Var(&l.format, "log-format", "format of log records on stderr: text or json (one object a line, for jq)")
	pf.Var(&l.level, "log-level", "lowest level of log records: debug, info, warn or error (default warn; info with -v)")
}

// logger returns the locker logger: records at the chosen level and above,
// in the chosen format, to w.
func (l *logOptions) logger(w io.Writer, verbose bool) *slog.Logger {
	level := slog.LevelWarn
	if verbose {
		level = slog.LevelInfo
	}
	if l.level.value != "" {
		_ = level.UnmarshalText([]byte(l.level.value))
	}
	return l.loggerAt(w, level)
}

// withDefault returns a logger at --log-level if given, else at def.
func (l *logOptions) withDefault(w io.Writer, def slog.Level) *slog.Logger {
	if l.level.value != "" {
		_ = def.UnmarshalText([]byte(l.level.value))
	}
	return l.loggerAt(w, def)
}

// loggerAt returns a logger in the chosen format at level.
func (l *logOptions) loggerAt(w io.Writer, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if l.format.value == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// choice is a flag value from a fixed set.
type choice struct {
	value   string
	allowed []string
}

func (c *choice) String() string { return c.value }
func (c *choice) Type() string   { return strings.Join(c.allowed, "|") }

func (c *choice) Set(s string) error {
	for _, a := range c.allowed {
		if s == a {
			c.value = s
			return nil
		}
	}
	return fmt.Errorf("must be one of %s, got %q", strings.Join(c.allowed, ", "), s)
}
