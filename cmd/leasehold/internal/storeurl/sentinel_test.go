package storeurl_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testredis"
)

// A master_name= URL opens a failover client over the sentinels: it reaches
// the master (sentinels refuse the scripts), and the master Sentinel
// promotes after a failover.
func TestOpenRedisSentinel(t *testing.T) {
	g := testredis.StartSentinel(t, testredis.SentinelOptions{})
	ctx := t.Context()
	o, err := storeurl.Open(ctx, g.URL()+"&prefix=s:")
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if o.Kind != storeurl.Redis || !o.Shared {
		t.Errorf("expected a shared redis store, got kind %s shared %v", o.Kind, o.Shared)
	}
	before, err := o.Store.Acquire(ctx, driver.AcquireRequest{Key: "before", Token: "tok", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := g.Master.Client(t).Exists(ctx, "s:{before}:lock").Result(); err != nil || n != 1 {
		t.Fatalf("expected the lock on the master %s, got %d, %v", g.Master.Addr, n, err)
	}

	old := g.Master.Addr
	g.Failover(t)
	nw := g.WaitNewMaster(t, old, 30*time.Second)
	// Sentinel promotes the new master before it demotes the old one: until
	// then a write can still land on the old master (docs/failover.md). Wait
	// for the demotion, so the lock below must land on the new master.
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := g.Server(old).Client(t).Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "role:slave") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the old master %s was not demoted within 20s: %v", old, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	deadline = time.Now().Add(20 * time.Second)
	var after driver.Grant
	for {
		// The client learns of the new master from the sentinels; until
		// then the old master, now a replica, refuses writes.
		if after, err = o.Store.Acquire(ctx, driver.AcquireRequest{Key: "after", Token: "tok", TTL: time.Minute}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("acquire after the failover to %s: %v", nw, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n, err := g.Server(nw).Client(t).Exists(ctx, "s:{after}:lock").Result(); err != nil || n != 1 {
		t.Errorf("expected the new lock on the new master %s, got %d, %v", nw, n, err)
	}
	if after.Fence <= before.Fence {
		t.Errorf("fence went backward across the failover: %d then %d", before.Fence, after.Fence)
	}
}

func TestOpenRedisSentinelRejects(t *testing.T) {
	for _, raw := range []string{
		"redis://127.0.0.1:26379?master_name=",
		"redis://127.0.0.1:26379?master_name=m&addr=nohost",
		"unix:///tmp/redis.sock?master_name=m",
	} {
		if _, err := storeurl.Open(t.Context(), raw); !errors.Is(err, storeurl.ErrBadURL) {
			t.Errorf("Open(%q): expected ErrBadURL, got %v", raw, err)
		}
	}
	// Not dialled at open; the description masks both passwords.
	o, err := storeurl.Open(t.Context(), "redis://:"+secret+"@127.0.0.1:1?master_name=m&addr=127.0.0.1:2&password="+secret)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(o.Desc, secret) {
		t.Errorf("description leaks the password: %q", o.Desc)
	}
	if err := o.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// A Sentinel URL's client leaves a sentinel that stops answering: no
// go-redis retries and a read timeout below the dial timeout
// (redisstore.TuneFailover), unless the URL sets them itself.
func TestOpenRedisSentinelTuned(t *testing.T) {
	o, err := storeurl.RedisClientOptions("redis://127.0.0.1:1?master_name=m&addr=127.0.0.1:2")
	if err != nil {
		t.Fatal(err)
	}
	// go-redis keeps "no retries" (-1) as 0 and the default as 3.
	if o.MaxRetries != 0 || o.ReadTimeout <= 0 || o.ReadTimeout >= o.DialTimeout {
		t.Errorf("expected no retries and 0 < ReadTimeout < DialTimeout, got %d, %v, %v", o.MaxRetries, o.ReadTimeout, o.DialTimeout)
	}
	o, err = storeurl.RedisClientOptions("redis://127.0.0.1:1?master_name=m&max_retries=2")
	if err != nil {
		t.Fatal(err)
	}
	if o.MaxRetries != 2 {
		t.Errorf("expected the URL's max_retries=2 kept, got %d", o.MaxRetries)
	}
}
