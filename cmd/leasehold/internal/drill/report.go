package drill

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
)

// Report is a drill's outcome: a verdict per invariant, the numbers behind
// them and the recorded history.
type Report struct {
	Config     ConfigSummary  `json:"config"`
	Passed     bool           `json:"passed"` // every invariant passed (INFO does not count)
	Invariants []Invariant    `json:"invariants"`
	Takeovers  []Takeover     `json:"takeovers"`
	Jobs       int            `json:"jobs"`
	Done       int            `json:"done"`
	Duration   time.Duration  `json:"duration_ns"`
	Events     map[string]int `json:"events"`
	History    History        `json:"history"`
}

// Takeover is one measured takeover after a silent holder.
type Takeover struct {
	Fault    Fault         `json:"fault"`
	Key      string        `json:"key"`
	Takeover time.Duration `json:"takeover_ns"`
	TTL      time.Duration `json:"ttl_ns"`
}

// ConfigSummary is the configuration as reported.
type ConfigSummary struct {
	Store          string        `json:"store"`
	Replicas       int           `json:"replicas"`
	Processes      bool          `json:"processes,omitempty"` // replicas ran as child processes
	Workload       Workload      `json:"workload"`
	Permits        int           `json:"permits,omitempty"` // the semaphore workload's limit
	Jobs           int           `json:"jobs"`
	TTL            time.Duration `json:"ttl_ns"`
	WorkMin        time.Duration `json:"work_min_ns"`
	WorkMax        time.Duration `json:"work_max_ns"`
	OnStoreError   string        `json:"on_store_error"`
	OnRenewFailure string        `json:"on_renew_failure"`
	Fencing        bool          `json:"fencing"`
	Register       string        `json:"register"` // memory, or the external register's URL without its password
	Faults         []Fault       `json:"faults"`
	Outage         time.Duration `json:"outage_ns"`
	Latency        time.Duration `json:"latency_ns"`
	Window         time.Duration `json:"window_ns"`
	DropRate       float64       `json:"drop_rate"`
}

func registerLabel(url string) string {
	if url == "" {
		return "memory"
	}
	return storeurl.Describe(url)
}

func summarize(c Config) ConfigSummary {
	s := ConfigSummary{
		Store: c.storeLabel(), Register: registerLabel(c.Register), Replicas: c.Replicas, Processes: c.Processes, Workload: c.Workload, Jobs: c.Jobs, TTL: c.TTL, WorkMin: c.WorkMin, WorkMax: c.WorkMax,
		OnStoreError: c.OnStoreError.String(), OnRenewFailure: c.OnRenewFailure.String(), Fencing: !c.NoFencing,
		Faults: c.Faults, Outage: c.Outage, Latency: c.Latency, Window: c.Window, DropRate: c.DropRate,
	}
	if c.Workload == WorkloadSemaphore {
		s.Permits = c.Permits
	}
	return s
}

// Failed returns the invariants that failed.
func (r *Report) Failed() []Invariant {
	var out []Invariant
	for _, iv := range r.Invariants {
		if iv.Verdict == Fail {
			out = append(out, iv)
		}
	}
	return out
}

// Invariant returns the invariant named name, or false.
func (r *Report) Invariant(name string) (Invariant, bool) {
	for _, iv := range r.Invariants {
		if iv.Name == name {
			return iv, true
		}
	}
	return Invariant{}, false
}

// WriteText writes one verdict line per invariant, then the details of every
// invariant that failed or is INFO (verbose: of every invariant).
func (r *Report) WriteText(w io.Writer, verbose bool) error {
	var b strings.Builder
	c := r.Config
	replicas := "replicas"
	if c.Processes {
		replicas = "replica processes"
	}
	register := ""
	if c.Register != "" && c.Register != "memory" {
		register = " (register " + c.Register + ")"
	}
	work := fmt.Sprintf("%d jobs", c.Jobs)
	switch c.Workload {
	case WorkloadElection:
		work = "election"
	case WorkloadSemaphore:
		work = fmt.Sprintf("semaphore of %d permits", c.Permits)
	}
	fmt.Fprintf(&b, "drill: store %s, %d %s, %s, TTL %v, %s, renew failure: %s, fencing %s%s, faults: %s\n",
		c.Store, c.Replicas, replicas, work, c.TTL, c.OnStoreError, c.OnRenewFailure, onOff(c.Fencing), register, faultList(c.Faults))
	for _, iv := range r.Invariants {
		fmt.Fprintf(&b, "%-4s  %-42s %s\n", iv.Verdict, iv.Name, iv.Summary)
		if verbose || iv.Verdict != Pass {
			for _, d := range iv.Details {
				fmt.Fprintf(&b, "      - %s\n", d)
			}
		}
	}
	if r.Passed {
		fmt.Fprintf(&b, "result: every invariant held (%v)\n", fmtDur(r.Duration))
	} else {
		fmt.Fprintf(&b, "result: %d invariants FAILED\n", len(r.Failed()))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON writes the report, history included, as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func faultList(fs []Fault) string {
	if len(fs) == 0 {
		return "none"
	}
	s := make([]string, len(fs))
	for i, f := range fs {
		s[i] = string(f)
	}
	return strings.Join(s, ",")
}
