package storeurl_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
)

// The odd inputs of issue 15: each once returned its password unchanged.
func TestDescribeOddInputs(t *testing.T) {
	const pw = "s3cretPW"
	for _, in := range []string{
		"redis://us#er:" + pw + "@127.0.0.1:6379",
		"redis://us?er:" + pw + "@127.0.0.1:6379",
		"redis:/:" + pw + "@127.0.0.1:6379",
		"redis:://:" + pw + "@127.0.0.1:6379",
		"redis//:" + pw + "@127.0.0.1:6379",
		"redis://u:" + pw + "@h:1#frag@x",
		"host=db.example port=5432 user=app password=" + pw + " dbname=locks",
		"host=db user=app password='" + pw + " x' dbname=locks",
		"postgres://app@db/locks?sslpassword=" + pw,
	} {
		got := storeurl.Describe(in)
		if strings.Contains(got, "cretP") {
			t.Errorf("Describe(%q) = %q: the password shows", in, got)
		}
		if !strings.Contains(got, "xxxxx") {
			t.Errorf("Describe(%q) = %q: expected the password masked as xxxxx", in, got)
		}
	}
}

// A URL that url.Parse reads with a different host (an unescaped '#' in the
// user name) is refused rather than opened.
func TestOpenRefusesMisreadUserInfo(t *testing.T) {
	for _, raw := range []string{
		"redis://us#er:s3cretPW@127.0.0.1:1",
		"postgres://us#er:s3cretPW@127.0.0.1:1/db",
		"redis://usr:ab/QXAz@127.0.0.1:1",
		"redis://usr:ab?QXAz@127.0.0.1:1",
	} {
		o, err := storeurl.Open(t.Context(), raw)
		if err == nil {
			_ = o.Close()
			t.Errorf("Open(%q): expected an error", storeurl.Describe(raw))
			continue
		}
		if !errors.Is(err, storeurl.ErrBadURL) || !strings.Contains(err.Error(), "percent-encode") {
			t.Errorf("Open(%q): expected ErrBadURL about percent-encoding, got %v", storeurl.Describe(raw), err)
		}
		for _, frag := range []string{"cretP", "QXA"} {
			if strings.Contains(err.Error(), frag) {
				t.Errorf("Open(%q): error shows %q: %v", storeurl.Describe(raw), frag, err)
			}
		}
	}
}

func TestRedactErrorScrubsPieces(t *testing.T) {
	raw := "redis://usr:abc/QXAdef@127.0.0.1:1"
	err := storeurl.RedactError(errors.New(`parse: invalid port ":QXAdef" after host "usr:abc"`), raw)
	if strings.Contains(err.Error(), "QXA") || strings.Contains(err.Error(), "def") || strings.Contains(err.Error(), "abc") {
		t.Errorf("RedactError left a piece of the password: %v", err)
	}
	get := &url.Error{Op: "Get", URL: "http://usr:QZJ%2FVK@127.0.0.1:1/api", Err: errors.New("connection refused")}
	if msg := storeurl.RedactError(fmt.Errorf("prometheus: %w", get), get.URL).Error(); strings.Contains(msg, "QZJ") || !strings.Contains(msg, "connection refused") {
		t.Errorf("RedactError of an HTTP error: expected the URL masked and the cause kept, got %s", msg)
	}
	wrapped := storeurl.RedactError(context.DeadlineExceeded, raw)
	if !errors.Is(wrapped, context.DeadlineExceeded) {
		t.Errorf("RedactError lost the chain: %v", wrapped)
	}
}

// urlSpecial is every character with a meaning in a URL, plus the percent
// sign and space.
const urlSpecial = ":/?#[]@!$&'()*+,;=% \"<>\\^`{|}~"

// passwordFromBytes maps fuzz input to a password of URL-special characters
// and marker letters (QZJVK, which appear nowhere else in the URLs or in
// the package's messages), so that every piece of the password that holds a
// marker can be searched for in the output.
func passwordFromBytes(b []byte) string {
	const alphabet = urlSpecial + "QZJVK0123"
	var sb strings.Builder
	for _, c := range b {
		sb.WriteByte(alphabet[int(c)%len(alphabet)])
	}
	return sb.String()
}

// leaks returns a piece of pw of 3 or more characters with a marker letter
// that appears in out.
func leaks(out, pw string) (string, bool) {
	for n := 3; n <= len(pw); n++ {
		for i := 0; i+n <= len(pw); i++ {
			p := pw[i : i+n]
			if strings.ContainsAny(p, "QZJVK") && strings.Contains(out, p) {
				return p, true
			}
		}
	}
	return "", false
}

var fuzzTemplates = []string{
	"redis://usr:%s@127.0.0.1:1",
	"rediss://usr:%s@127.0.0.1:1/0?prefix=p:",
	"redis://usr:%s@127.0.0.1:1?addr=127.0.0.1:2",
	"redis://:%s@127.0.0.1:1/notadb",
	"redis:/:%s@127.0.0.1:1",
	"redis//usr:%s@127.0.0.1:1",
	"etcd://usr:%s@127.0.0.1:1",
	"etcds://usr:%s@127.0.0.1:1?prefix=p",
	"postgres://usr:%s@127.0.0.1:1/db?sslmode=disable",
	"postgres://usr:%s@127.0.0.1:notaport/db",
	"host=127.0.0.1 user=usr password=%s dbname=db",
	"mysql://usr:%s@h:1",
	"redis://us#er:%s@127.0.0.1:1",
}

func checkNoLeak(t *testing.T, pw string) {
	t.Helper()
	for _, tmpl := range fuzzTemplates {
		raw := strings.Replace(tmpl, "%s", pw, 1)
		if p, ok := leaks(storeurl.Describe(raw), pw); ok {
			t.Errorf("Describe(%q) shows %q: %s", raw, p, storeurl.Describe(raw))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		o, err := storeurl.Open(ctx, raw)
		cancel()
		if err == nil {
			if p, ok := leaks(o.Desc, pw); ok {
				t.Errorf("Open(%q).Desc shows %q", raw, p)
			}
			_ = o.Close()
			continue
		}
		if p, ok := leaks(err.Error(), pw); ok {
			t.Errorf("Open(%q) error shows %q: %v", raw, p, err)
		}
	}
}

// FuzzNoPasswordInOutput is also run as a normal test over its seed corpus
// (go test runs the seeds; go test -fuzz=FuzzNoPasswordInOutput explores).
func FuzzNoPasswordInOutput(f *testing.F) {
	for _, seed := range []string{
		"QXA/QXA", "QZJ#VKQ", "QZJ?VKQ", "QZ:J/V@K", "QZJ%zzVK", "QZJ%41VK", "Q Z J V K",
		"QZJ[VK]", "QZJ@@VK", "QZJ://VK", "QZJ&password=VK", "'QZJ'VK", "QZJ\\VK", "QZJ%VK",
		"QZJ VKQ=ZJV K", "QZJ horse=VKQ staple", // unquoted libpq values with a space and '='
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// The seeds are passwords as written; fuzz input is mapped to one.
		pw := string(b)
		if strings.Trim(pw, urlSpecial+"QZJVK0123") != "" {
			pw = passwordFromBytes(b)
		}
		if len(pw) > 40 {
			pw = pw[:40]
		}
		checkNoLeak(t, pw)
	})
}

func TestPasswordFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "pw")
	if err := os.WriteFile(file, []byte("QZJ/#?VK\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := storeurl.Open(t.Context(), "redis://usr@127.0.0.1:1/notadb?password_file="+file)
	if err == nil || !strings.Contains(err.Error(), "database") {
		t.Fatalf("expected the URL (with the file's password) to reach go-redis's parser, got %v", err)
	}
	if strings.Contains(err.Error(), "QZJ") {
		t.Errorf("error shows the file's password: %v", err)
	}
	_, err = storeurl.Open(t.Context(), "redis://usr:pw@127.0.0.1:1?password_file="+file)
	if !errors.Is(err, storeurl.ErrBadURL) || !strings.Contains(err.Error(), "password file") {
		t.Errorf("a password and a password file: expected ErrBadURL, got %v", err)
	}
	_, err = storeurl.Open(t.Context(), "redis://127.0.0.1:1?password_file="+filepath.Join(dir, "missing"))
	if !errors.Is(err, storeurl.ErrBadURL) {
		t.Errorf("a missing password file: expected ErrBadURL, got %v", err)
	}
}

func TestPasswordFileFromEnvironment(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(file, []byte("QZJ:VK@x"), 0o600); err != nil {
		t.Fatal(err)
	}
	getenv := func(k string) string {
		if k == storeurl.EnvPasswordFile {
			return file
		}
		return ""
	}
	// The file's password reaches the URL: etcd's parser sees the user
	// information and, without a user name, refuses it.
	_, err := storeurl.OpenEnv(t.Context(), "etcd://127.0.0.1:1", getenv)
	if !errors.Is(err, storeurl.ErrBadURL) || !strings.Contains(err.Error(), "user name") {
		t.Errorf("expected the password from the environment's file to need a user name, got %v", err)
	}
	if strings.Contains(err.Error(), "QZJ") {
		t.Errorf("error shows the password: %v", err)
	}
}

// Redaction never shows which fragments a password contains: a password
// with "tcd" in it does not turn "etcd://" into "exxxxx://".
func TestRedactionRevealsNoFragment(t *testing.T) {
	for _, raw := range []string{
		"etcd://usr:xtcdQZJ@127.0.0.1:notaport",
		"redis://usr:edisQZJ@127.0.0.1:notaport",
	} {
		_, err := storeurl.Open(t.Context(), raw)
		if err == nil {
			t.Fatalf("%s: expected an error", raw)
		}
		if strings.Contains(err.Error(), "xxxxx:") && !strings.Contains(err.Error(), "usr:xxxxx@") || strings.Contains(err.Error(), "exxxxx") || strings.Contains(err.Error(), "rxxxxx") {
			t.Errorf("%s: the error masks a fragment of the password in other text: %v", raw, err)
		}
		if strings.Contains(err.Error(), "QZJ") {
			t.Errorf("%s: the error shows the password: %v", raw, err)
		}
	}
}
