package drill_test

import (
	"fmt"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/drill"
)

func ExampleParseFaults() {
	fs, err := drill.ParseFaults("restart,pause")
	fmt.Println(fs, err)
	fs, _ = drill.ParseFaults("all")
	fmt.Println(fs)
	// Output:
	// [pause restart] <nil>
	// [pause outage crash latency lostreply restart]
}
