package drill

import (
	"os"
	"testing"
)

func TestSmoke(t *testing.T) {
	if os.Getenv("DRILL_SMOKE") == "" {
		t.Skip()
	}
	cfg := Config{Faults: AllFaults, Seed: 1}
	if os.Getenv("UNSAFE") != "" {
		cfg.NoFencing = true
		cfg.OnStoreError = 1
	}
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	rep.WriteText(os.Stdout, true)
}
