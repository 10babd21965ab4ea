package storeurl

import "github.com/redis/go-redis/v9"

// RedisClientOptions returns the options of the client a redis:// URL
// opens (single node or Sentinel), without dialling.
func RedisClientOptions(raw string) (*redis.Options, error) {
	r, err := parseRedis(raw, raw, common{})
	if err != nil {
		return nil, err
	}
	defer r.client.Close()
	return r.client.(*redis.Client).Options(), nil
}
