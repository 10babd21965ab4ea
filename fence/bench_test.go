package fence_test

import (
	"testing"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/internal/resourcetest"
)

func BenchmarkRegisterWrite(b *testing.B) {
	resourcetest.BenchWrites(b, fence.NewRegister(fence.RegisterOptions{}))
}
