package main

import (
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
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
	runExample(t, append([]string(nil), fields[1:]...))

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

	// The sandbox: exposure at most 3.0, and the textfile directory, which
	// ProtectSystem=strict makes read-only, writable.
	out, err = exec.Command(analyze, "security", "--offline=true", "--no-pager", filepath.Join(dir, "leasehold-report.service")).CombinedOutput()
	m := regexp.MustCompile(`Overall exposure level for leasehold-report.service: ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("systemd-analyze security: no exposure level (%v):\n%s", err, out)
	}
	if level, _ := strconv.ParseFloat(string(m[1]), 64); level > 3.0 {
		t.Errorf("systemd-analyze security: expected exposure at most 3.0, got %.1f:\n%s", level, out)
	}
	textfile := fields[slicesIndex(fields, "--metrics-textfile")+1]
	if !strings.Contains(svc, "ReadWritePaths="+textfile+"\n") {
		t.Errorf("expected ReadWritePaths=%s for --metrics-textfile under ProtectSystem=strict", textfile)
	}
}

// podSpec is the part of a pod spec the examples use; decoding is strict,
// so a misspelled or misplaced field fails.
type podSpec struct {
	RestartPolicy                string `yaml:"restartPolicy"`
	AutomountServiceAccountToken *bool  `yaml:"automountServiceAccountToken"`
	SecurityContext              struct {
		RunAsNonRoot   bool `yaml:"runAsNonRoot"`
		RunAsUser      int  `yaml:"runAsUser"`
		RunAsGroup     int  `yaml:"runAsGroup"`
		SeccompProfile struct {
			Type string `yaml:"type"`
		} `yaml:"seccompProfile"`
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
		SecurityContext struct {
			ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
			AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
			Capabilities             struct {
				Drop []string `yaml:"drop"`
			} `yaml:"capabilities"`
		} `yaml:"securityContext"`
		VolumeMounts []struct {
			Name      string `yaml:"name"`
			MountPath string `yaml:"mountPath"`
			ReadOnly  bool   `yaml:"readOnly"`
		} `yaml:"volumeMounts"`
		Resources struct {
			Requests map[string]string `yaml:"requests"`
			Limits   map[string]string `yaml:"limits"`
		} `yaml:"resources"`
	} `yaml:"containers"`
	Volumes []struct {
		Name   string `yaml:"name"`
		Secret *struct {
			SecretName  string `yaml:"secretName"`
			DefaultMode int    `yaml:"defaultMode"`
			Items       []struct {
				Key  string `yaml:"key"`
				Path string `yaml:"path"`
			} `yaml:"items"`
		} `yaml:"secret"`
		ConfigMap *struct {
			Name string `yaml:"name"`
		} `yaml:"configMap"`
		EmptyDir *struct{} `yaml:"emptyDir"`
	} `yaml:"volumes"`
}

// cronJob is the part of batch/v1 CronJob the example uses.
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
					Spec podSpec `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		} `yaml:"jobTemplate"`
	} `yaml:"spec"`
}

// deployment is the part of apps/v1 Deployment the example uses.
type deployment struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		Replicas int `yaml:"replicas"`
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec podSpec `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// checkHardened checks the pod hardening of a deploy example: non-root,
// RuntimeDefault seccomp, no service account token, and per container a
// read-only root filesystem, no privilege escalation, every capability
// dropped, and the store password from a mounted Secret file (never a
// literal or an environment variable).
func checkHardened(t *testing.T, name string, spec podSpec) {
	t.Helper()
	sc := spec.SecurityContext
	if !sc.RunAsNonRoot || sc.RunAsUser == 0 || sc.SeccompProfile.Type != "RuntimeDefault" {
		t.Errorf("%s: expected runAsNonRoot, a non-zero runAsUser and seccomp RuntimeDefault, got %+v", name, sc)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("%s: expected automountServiceAccountToken: false", name)
	}
	secretVolumes := map[string]bool{}
	for _, v := range spec.Volumes {
		if v.Secret != nil {
			secretVolumes[v.Name] = true
			if v.Secret.DefaultMode&0o077 != 0 {
				t.Errorf("%s: secret volume %s: expected a mode without group or other access, got %o", name, v.Name, v.Secret.DefaultMode)
			}
		}
	}
	for _, c := range spec.Containers {
		csc := c.SecurityContext
		if !csc.ReadOnlyRootFilesystem || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation ||
			len(csc.Capabilities.Drop) != 1 || csc.Capabilities.Drop[0] != "ALL" {
			t.Errorf("%s: container %s: expected readOnlyRootFilesystem, allowPrivilegeEscalation false and capabilities drop [ALL], got %+v", name, c.Name, csc)
		}
		var store, pwFile string
		for _, e := range c.Env {
			switch {
			case e.ValueFrom.SecretKeyRef.Name != "":
				t.Errorf("%s: container %s: %s comes from a Secret as an environment variable: mount it as a file", name, c.Name, e.Name)
			case e.Name == "LEASEHOLD_STORE":
				store = e.Value
			case e.Name == "LEASEHOLD_STORE_PASSWORD_FILE":
				pwFile = e.Value
			}
		}
		u, err := url.Parse(store)
		if _, hasPassword := u.User.Password(); err != nil || store == "" || hasPassword {
			t.Errorf("%s: container %s: expected LEASEHOLD_STORE without a password, got %q", name, c.Name, store)
		}
		mounted := false
		for _, m := range c.VolumeMounts {
			if secretVolumes[m.Name] && m.ReadOnly && pwFile != "" && strings.HasPrefix(pwFile, m.MountPath+"/") {
				mounted = true
			}
		}
		if !mounted {
			t.Errorf("%s: container %s: expected LEASEHOLD_STORE_PASSWORD_FILE in a read-only Secret volume, got %q", name, c.Name, pwFile)
		}
	}
}

func TestKubernetesDeployment(t *testing.T) {
	var d deployment
	if err := yaml.UnmarshalStrict([]byte(readFile(t, filepath.Join(deployDir, "kubernetes/deployment.yaml"))), &d); err != nil {
		t.Fatalf("deployment.yaml: %v", err)
	}
	if d.APIVersion != "apps/v1" || d.Kind != "Deployment" || d.Spec.Replicas < 2 {
		t.Errorf("expected an apps/v1 Deployment with at least 2 replicas, got %s %s with %d", d.APIVersion, d.Kind, d.Spec.Replicas)
	}
	for k, v := range d.Spec.Selector.MatchLabels {
		if d.Spec.Template.Metadata.Labels[k] != v {
			t.Errorf("expected the pod template to carry the selector's label %s=%s", k, v)
		}
	}
	checkHardened(t, "deployment.yaml", d.Spec.Template.Spec)
	if c := d.Spec.Template.Spec.Containers; len(c) != 1 || len(c[0].Args) == 0 || c[0].Args[0] != "elect" {
		t.Errorf("expected one container running leasehold elect")
	}
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
	checkHardened(t, "cronjob.yaml", spec)
	runExample(t, append([]string(nil), spec.Containers[0].Args...))
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
	case !regexp.MustCompile(`^golang:\d+\.\d+\.\d+-`).MatchString(froms[0]):
		t.Errorf("expected the build image pinned to an exact Go version, got %q", froms[0])
	}
	ignore := readFile(t, filepath.Join(deployDir, "../.dockerignore"))
	for _, want := range []string{".git", "*.env", "*.key"} {
		if !strings.Contains(ignore, want+"\n") {
			t.Errorf(".dockerignore: expected %s left out of the build context", want)
		}
	}
}
