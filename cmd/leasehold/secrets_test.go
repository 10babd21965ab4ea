package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/testredis"
)

// TestCLINeverPrintsPasswords runs commands with store URLs whose passwords
// hold URL-special characters (unescaped, so most URLs are malformed) and
// checks that no piece of 3 or more characters of the password reaches
// stdout or stderr, whether it comes from --store or LEASEHOLD_STORE.
func TestCLINeverPrintsPasswords(t *testing.T) {
	const pw = "QZJ/VK?QX#JZ@KV"
	urls := []string{
		"redis://usr:" + pw + "@127.0.0.1:1",
		"redis://us#er:" + pw + "@127.0.0.1:1",
		"rediss://usr:" + pw + "@127.0.0.1:1?ca_file=/nonexistent",
		"etcd://usr:" + pw + "@127.0.0.1:1",
		"postgres://usr:" + pw + "@127.0.0.1:1/db",
		"host=127.0.0.1 user=usr password=" + pw + " dbname=db",
		"redis:/:" + pw + "@127.0.0.1:1",
	}
	cmds := [][]string{{"ls"}, {"inspect", "k"}, {"run", "--key", "k", "--ttl", "5s", "--", "true"}, {"setup", "redis"}}
	for _, u := range urls {
		for _, c := range cmds {
			_, out, errOut := lh(t, nil, append(append([]string{}, c...), "--store", u)...)
			checkNoPiece(t, c[0]+" --store", pw, out+errOut)
			if c[0] == "run" {
				_, out, errOut = lh(t, []string{"LEASEHOLD_STORE=" + u}, c...)
				checkNoPiece(t, c[0]+" with LEASEHOLD_STORE", pw, out+errOut)
			}
		}
	}
}

func checkNoPiece(t *testing.T, what, pw, out string) {
	t.Helper()
	for n := 3; n <= len(pw); n++ {
		for i := 0; i+n <= len(pw); i++ {
			if p := pw[i : i+n]; strings.ContainsAny(p, "QZJVK") && strings.Contains(out, p) {
				t.Errorf("%s: output shows %q of the password:\n%s", what, p, out)
				return
			}
		}
	}
}

// TestSetupRedisThenFunctions: an operator loads the library, a service
// with functions=true and a password file runs a job as a user without
// +eval.
func TestSetupRedisThenFunctions(t *testing.T) {
	srv := testredis.Start(t)
	admin := srv.Client(t)
	if err := admin.Do(t.Context(), "ACL", "SETUSER", "svc", "on", ">QZJ/pw#1", "resetkeys", "~leasehold:*", "resetchannels", "&leasehold:*", "-@all",
		"+fcall", "+get", "+set", "+pexpire", "+pttl", "+del", "+exists", "+hget", "+hgetall", "+hset", "+hdel", "+hincrby", "+zadd", "+zcard", "+zrange", "+zrank", "+zrem",
		"+publish", "+spublish", "+time", "+subscribe", "+ssubscribe").Err(); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(file, []byte("QZJ/pw#1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	svc := "redis://svc@" + srv.Addr + "?functions=true&password_file=" + file
	if code, out, errOut := lh(t, nil, "run", "--store", svc, "--key", "k", "--ttl", "5s", "--", "true"); code != 78 || !strings.Contains(errOut, "setup redis") {
		t.Errorf("before setup: expected exit 78 naming setup redis, got %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := lh(t, nil, "setup", "redis", "--store", srv.URL()); code != 0 || !strings.Contains(out, "loaded") {
		t.Fatalf("setup redis: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut := lh(t, []string{"LEASEHOLD_STORE=redis://svc@" + srv.Addr + "?functions=true", "LEASEHOLD_STORE_PASSWORD_FILE=" + file},
		"run", "--key", "k", "--ttl", "5s", "--", "sh", "-c", "echo fence=$LEASEHOLD_FENCE")
	if code != 0 || !strings.Contains(out, "fence=") {
		t.Errorf("run with functions as the service user: exit %d\n%s%s", code, out, errOut)
	}
	if err := admin.Do(t.Context(), "ACL", "DRYRUN", "svc", "EVAL", "return 1", "0").Err(); err == nil {
		// DRYRUN answers OK only when allowed.
		if v, _ := admin.Do(t.Context(), "ACL", "DRYRUN", "svc", "EVAL", "return 1", "0").Text(); v == "OK" {
			t.Errorf("the service user may EVAL")
		}
	}
}

// TestSetupRedisRefusedIsConfiguration: `setup redis` as a user whose ACL
// does not allow FUNCTION (NOPERM), or with a wrong password (WRONGPASS),
// is a configuration error (exit 2, naming the permission), not an
// unavailable store (69): retrying cannot fix it. A stopped server is
// still 69.
func TestSetupRedisRefusedIsConfiguration(t *testing.T) {
	srv := testredis.Start(t)
	admin := srv.Client(t)
	if err := admin.Do(t.Context(), "ACL", "SETUSER", "svc", "on", ">QZJ/pw#2", "resetkeys", "~leasehold:*", "-@all", "+fcall", "+get", "+set").Err(); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(file, []byte("QZJ/pw#2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, url, pw string }{
		{"NOPERM", "redis://svc@" + srv.Addr + "?password_file=" + file, "QZJ/pw#2"},
		{"WRONGPASS", "redis://svc:QZJ-wrong@" + srv.Addr, "QZJ-wrong"},
	} {
		code, out, errOut := lh(t, nil, "setup", "redis", "--store", c.url)
		if code != 77 || !strings.Contains(errOut, c.name) || !strings.Contains(errOut, "FUNCTION") {
			t.Errorf("%s: expected exit 77 naming %s and FUNCTION, got %d\n%s%s", c.name, c.name, code, out, errOut)
		}
		checkNoPiece(t, c.name, c.pw, out+errOut)
	}
	if n, err := admin.Do(t.Context(), "FUNCTION", "LIST").Slice(); err != nil || len(n) != 0 {
		t.Errorf("a refused setup loaded a library: %v %v", n, err)
	}
	down := testredis.Start(t)
	addr := down.Addr
	down.Stop()
	if code, out, errOut := lh(t, nil, "setup", "redis", "--store", "redis://"+addr); code != 69 {
		t.Errorf("stopped server: expected exit 69, got %d\n%s%s", code, out, errOut)
	}
}
