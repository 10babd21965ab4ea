package contention

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// EtcdCounter counts the gRPC requests an etcd server has received, from
// its Prometheus endpoint (metricsURL, e.g. http://127.0.0.1:2379/metrics):
// unary calls started plus messages received on streams (watch creates and
// cancels, lease keep-alives).
func EtcdCounter(metricsURL string) func(context.Context) (int64, error) {
	return func(ctx context.Context) (int64, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL, nil)
		if err != nil {
			return 0, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		var n float64
		s := bufio.NewScanner(resp.Body)
		s.Buffer(make([]byte, 1<<16), 1<<20)
		for s.Scan() {
			l := s.Text()
			unary := strings.Contains(l, `grpc_type="unary"`)
			if (strings.HasPrefix(l, "grpc_server_started_total{") && unary) ||
				(strings.HasPrefix(l, "grpc_server_msg_received_total{") && !unary) {
				v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
				if err == nil {
					n += v
				}
			}
		}
		return int64(n), s.Err()
	}
}

// PostgresCounter counts the statements a PostgreSQL server has run, from
// pg_stat_statements (which must be in shared_preload_libraries; the
// extension is created here). Each counting query adds one statement,
// which the caller subtracts (Target.CountOverhead = 1).
func PostgresCounter(ctx context.Context, url string) (func(context.Context) (int64, error), func(), error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		_ = conn.Close(ctx)
		return nil, nil, fmt.Errorf("pg_stat_statements (start the server with shared_preload_libraries=pg_stat_statements): %w", err)
	}
	count := func(ctx context.Context) (int64, error) {
		var n int64
		err := conn.QueryRow(ctx, "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements").Scan(&n)
		return n, err
	}
	return count, func() { _ = conn.Close(context.Background()) }, nil
}

// RedisPubSubCounter counts the pub/sub commands a Redis server has run
// (SUBSCRIBE, UNSUBSCRIBE and their sharded and pattern forms, from INFO
// commandstats). go-redis sends them on its pub/sub connection, past the
// client hooks that count every other request in the replicas, so the two
// counts add up to the requests sent.
func RedisPubSubCounter(url string) (func(context.Context) (int64, error), func(), error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, nil, err
	}
	c := redis.NewClient(opts)
	count := func(ctx context.Context) (int64, error) {
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			return 0, err
		}
		var n int64
		for _, l := range strings.Split(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(l), ":")
			cmd := strings.TrimPrefix(name, "cmdstat_")
			if !ok || !strings.HasSuffix(cmd, "subscribe") {
				continue
			}
			calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
			v, err := strconv.ParseInt(calls, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("INFO commandstats %q: %w", l, err)
			}
			n += v
		}
		return n, nil
	}
	return count, func() { _ = c.Close() }, nil
}

// RedisServerStats reads a Redis server's commands run so far (the calls of
// INFO commandstats, commands inside scripts included, INFO itself left
// out: the counters send it) and its CPU time
// (used_cpu_sys + used_cpu_user of INFO cpu): Target.Server.
func RedisServerStats(url string) (func(context.Context) (ServerStats, error), func(), error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, nil, err
	}
	c := redis.NewClient(opts)
	stats := func(ctx context.Context) (ServerStats, error) {
		info, err := c.Info(ctx, "commandstats", "cpu").Result()
		if err != nil {
			return ServerStats{}, err
		}
		var st ServerStats
		var cpu float64
		for _, l := range strings.Split(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(l), ":")
			switch {
			case !ok:
			case strings.HasPrefix(name, "cmdstat_") && name != "cmdstat_info":
				calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
				v, err := strconv.ParseInt(calls, 10, 64)
				if err != nil {
					return ServerStats{}, fmt.Errorf("INFO commandstats %q: %w", l, err)
				}
				st.Commands += v
			case name == "used_cpu_sys" || name == "used_cpu_user":
				v, err := strconv.ParseFloat(rest, 64)
				if err != nil {
					return ServerStats{}, fmt.Errorf("INFO cpu %q: %w", l, err)
				}
				cpu += v
			}
		}
		st.CPU = time.Duration(cpu * float64(time.Second))
		return st, nil
	}
	return stats, func() { _ = c.Close() }, nil
}
