package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v2"

	"github.com/leasehold/leasehold/internal/testredis"
)

const deployDir = "../../deploy"

// execArgs splits a unit's ExecStart (no quoting in ours) and runs it with
// the built binary against a real Redis, the job replaced by true: the
// example's flags must be ones run accepts.
func runExample(t *testing.T, args []string) {
	t.Helper()
	srv := testredis.Start(t)
	for i, a := range args {
		if a == "--metrics-textfile" {
			args[i+1] = t.TempDir()
		}
	}
	dash := slicesIndex(args, "--")
	if dash < 0 {
		t.Fatalf("expected the example's command after --, got %q", args)
	}
	args = append(args[:dash+1:dash+1], "true")
	if code, _, stderr := lh(t, storeEnv(srv), args...); code != 0 {
		t.Errorf("the example's command line %q: expected exit 0, got %d: %s", args, code, stderr)
	}
}

func slicesIndex(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func TestSystemdUnitsVerify(t *testing.T) {
	svc := readFile(t, filepath.Join(deployDir, "systemd/leasehold-report.service"))
	timer := readFile(t, filepath.Join(deployDir, "systemd/leasehold-report.timer"))
	var execStart string
	for _, line := range strings.Split(svc, "\n") {
		if v, ok := strings.CutPrefix(line, "ExecStart="); ok {
			execStart = v
		}
	}
	fields := strings.Fields(execStart)
	if len(fields) < 2 || fields[0] != "/usr/local/bin/leasehold" {
		t.Fatalf("expected ExecStart to run /usr/local/bin/leasehold, got %q", execStart)
	}
	runExample(t, fields[1:])

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed: the units were checked by running their command line only")
	}
	// verify wants the programs to exist: point them at the test binary and true.
	dir := t.TempDir()
	svc = strings.ReplaceAll(svc, "/usr/local/bin/leasehold ", bin+" ")
	svc = strings.ReplaceAll(svc, "/usr/local/bin/nightly-report", "/bin/true")
	for name, body := range map[string]string{"leasehold-report.service": svc, "leasehold-report.timer": timer} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(analyze, "verify", "--man=no", filepath.Join(dir, "leasehold-report.service"), filepath.Join(dir, "leasehold-report.timer")).CombinedOutput()
	for _, line := range strings.Split(string(out), "\n") {
		// Inside a container there is no running systemd; only the units' own problems count.
		if strings.Contains(line, "leasehold-report") {
			t.Errorf("systemd-analyze verify: %s", line)
		}
	}
	if err != nil && strings.Contains(string(out), "leasehold-report") {
		t.Errorf("systemd-analyze verify failed: %v\n%s", err, out)
	}
}

// cronJob is the part of batch/v1 CronJob the example uses; decoding is
// strict, so a misspelled or misplaced field fails.
type cronJob struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		Schedule                string `yaml:"schedule"`
		ConcurrencyPolicy       string `yaml:"concurrencyPolicy"`
		StartingDeadlineSeconds int    `yaml:"startingDeadlineSeconds"`
		JobTemplate             struct {
			Spec struct {
				BackoffLimit int `yaml:"backoffLimit"`
				Template     struct {
					Spec struct {
						RestartPolicy   string `yaml:"restartPolicy"`
						SecurityContext struct {
							RunAsNonRoot bool `yaml:"runAsNonRoot"`
						} `yaml:"securityContext"`
						Containers []struct {
							Name    string   `yaml:"name"`
							Image   string   `yaml:"image"`
							Command []string `yaml:"command"`
							Args    []string `yaml:"args"`
							Env     []struct {
								Name      string `yaml:"name"`
								Value     string `yaml:"value"`
								ValueFrom struct {
									SecretKeyRef struct {
										Name string `yaml:"name"`
										Key  string `yaml:"key"`
									} `yaml:"secretKeyRef"`
								} `yaml:"valueFrom"`
							} `yaml:"env"`
							Resources struct {
								Requests map[string]string `yaml:"requests"`
								Limits   map[string]string `yaml:"limits"`
							} `yaml:"resources"`
						} `yaml:"containers"`
					} `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		} `yaml:"jobTemplate"`
	} `yaml:"spec"`
}

func TestKubernetesCronJob(t *testing.T) {
	var cj cronJob
	if err := yaml.UnmarshalStrict([]byte(readFile(t, filepath.Join(deployDir, "kubernetes/cronjob.yaml"))), &cj); err != nil {
		t.Fatalf("cronjob.yaml: %v", err)
	}
	spec := cj.Spec.JobTemplate.Spec.Template.Spec
	switch {
	case cj.APIVersion != "batch/v1" || cj.Kind != "CronJob":
		t.Errorf("expected batch/v1 CronJob, got %s %s", cj.APIVersion, cj.Kind)
	case len(strings.Fields(cj.Spec.Schedule)) != 5:
		t.Errorf("expected a five-field schedule, got %q", cj.Spec.Schedule)
	case spec.RestartPolicy != "Never" && spec.RestartPolicy != "OnFailure":
		t.Errorf("a Job's pods need restartPolicy Never or OnFailure, got %q", spec.RestartPolicy)
	case len(spec.Containers) != 1 || len(spec.Containers[0].Command) != 1:
		t.Fatalf("expected one container with the leasehold command")
	}
	c := spec.Containers[0]
	for _, e := range c.Env {
		if e.Name == "LEASEHOLD_STORE" && (e.Value != "" || e.ValueFrom.SecretKeyRef.Name == "") {
			t.Errorf("expected LEASEHOLD_STORE from a Secret, not a literal value")
		}
	}
	runExample(t, append([]string(nil), c.Args...))
}

func TestDockerfile(t *testing.T) {
	df := readFile(t, filepath.Join(deployDir, "docker/Dockerfile"))
	var froms []string
	for _, line := range strings.Split(df, "\n") {
		if f, ok := strings.CutPrefix(line, "FROM "); ok {
			froms = append(froms, f)
		}
	}
	switch {
	case len(froms) != 2:
		t.Errorf("expected a two-stage build, got FROM %q", froms)
	case !strings.Contains(df, "-tags "+buildTags+" "):
		t.Errorf("expected the Makefile's -tags %s (14 MB less binary)", buildTags)
	case !strings.Contains(df, "CGO_ENABLED=0"):
		t.Error("expected a static build (CGO_ENABLED=0): the final image has no libc")
	case !strings.Contains(froms[1], "static") || !strings.Contains(froms[1], "nonroot"):
		t.Errorf("expected a static, non-root final image, got %q", froms[1])
	case !strings.Contains(df, `ENTRYPOINT ["/usr/local/bin/leasehold"]`):
		t.Error("expected an exec-form ENTRYPOINT running the binary")
	case !strings.Contains(df, "WORKDIR /src/cmd/leasehold"):
		t.Error("expected the build to run in the cmd/leasehold module")
	}
}
