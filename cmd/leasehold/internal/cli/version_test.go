package cli

import "testing"

func TestBuildVersionStamp(t *testing.T) {
	if got := buildVersion().Version; got == "" {
		t.Fatalf("expected a version without a stamp ((devel) or the module's), got %q", got)
	}
	old := version
	t.Cleanup(func() { version = old })
	version = "v9.8.7"
	if got := buildVersion().Version; got != "v9.8.7" {
		t.Fatalf("expected the -X stamp v9.8.7, got %q", got)
	}
}
