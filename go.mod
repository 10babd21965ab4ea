module github.com/leasehold/leasehold

go 1.25.0

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/redis/go-redis/v9 v9.22.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	golang.org/x/sys v0.30.0 // indirect
)
