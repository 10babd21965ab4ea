package fencetest_test

import (
	"context"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fencetest"
)

// Check the in-memory fenced register: four writers on two keys, every third
// lease paused past its TTL before writing.
func Example() {
	ctx := context.Background()
	reg := fence.NewRegister(fence.RegisterOptions{})
	read := func(_ context.Context, key string) ([]byte, uint64, error) {
		v, f, ok := reg.Read(key)
		if !ok {
			return nil, 0, fence.ErrNotFound
		}
		return v, f, nil
	}
	res, err := fencetest.Run(ctx, reg, read, fencetest.Config{TTL: 30 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	fmt.Println("fence rule kept:", res.Err() == nil)
	fmt.Println("stale writes accepted:", len(res.Stale))
	// Output:
	// fence rule kept: true
	// stale writes accepted: 0
}
