package cli

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// version is the release a binary was built as, stamped by `make release`
// (-ldflags "-X github.com/leasehold/leasehold/cmd/leasehold/internal/cli.version=vX.Y.Z",
// RELEASING.md). Empty otherwise: `go install …/cmd/leasehold@vX.Y.Z`
// needs no stamp, the module version is in the build info. commit is the
// revision `make release` built (it builds with -buildvcs=false, so that a
// tag's checkout and its source archive make the same bytes).
var version, commit string

// versionInfo is what `leasehold version` prints, from the build info Go
// embeds in the binary.
type versionInfo struct {
	Version  string `json:"version"`
	Commit   string `json:"commit,omitempty"`
	Time     string `json:"commit_time,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	Go       string `json:"go"`
}

func buildVersion() versionInfo {
	v := versionInfo{Version: "(devel)"}
	bi, ok := debug.ReadBuildInfo()
	if ok {
		v.Go = bi.GoVersion
		// The module version: vX.Y.Z from `go install …@vX.Y.Z`, a
		// pseudo-version from a build in a git checkout, "(devel)" without
		// version control information.
		if bi.Main.Version != "" {
			v.Version = bi.Main.Version
		}
	}
	// A release build says which release it is, also when it was built from
	// a checkout (where the build info has a pseudo-version or "(devel)").
	if version != "" {
		v.Version = version
	}
	if commit != "" {
		v.Commit = commit
	}
	if !ok {
		return v
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func (a *App) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and Go version of this binary",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := buildVersion()
			if a.json {
				return writeJSON(a.Stdout, v)
			}
			commit := v.Commit
			if commit == "" {
				commit = "unknown"
			}
			if v.Modified {
				commit += " (modified)"
			}
			fmt.Fprintf(a.Stdout, "leasehold %s\ncommit %s\n%s\n", v.Version, commit, v.Go)
			return nil
		},
	}
}

// helpCmd is `leasehold help [COMMAND]`; an unknown topic is bad usage (exit
// 2), not a cheerful exit 0.
func (a *App) helpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "help [COMMAND]",
		Short: "Help about any command",
		RunE: func(cmd *cobra.Command, args []string) error {
			target, rest, err := cmd.Root().Find(args)
			if err != nil || target == nil || len(rest) > 0 {
				topic := strings.Join(args, " ")
				if s := suggestions(cmd.Root(), args[0]); len(s) > 0 && s[0] != args[0] {
					return Exit(ExitUsage, "unknown help topic %q; did you mean %s?", topic, strings.Join(s, " or "))
				}
				return Exit(ExitUsage, "unknown help topic %q; 'leasehold help' lists the commands", topic)
			}
			return target.Help()
		},
	}
}
