package cli

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

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
	if !ok {
		return v
	}
	v.Go = bi.GoVersion
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
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
