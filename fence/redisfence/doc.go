// Package redisfence is a fenced Redis resource: a fence.Resource that stores
// each key as a hash {value, fence} and writes it with one Lua script, so the
// fence check and the write are atomic and cost one round trip.
//
// It lives in the root module beside redisstore: a program that uses Redis
// for its leases already builds go-redis.
package redisfence
