package provider

import (
	"os"
	"testing"

	"github.com/labcloud/labcloud/metrics"
)

// TestMain registers labcloud's metrics before any test runs, as the CCM's
// main does before the provider starts: a metric vector's child taken
// before registration would count nothing.
func TestMain(m *testing.M) {
	metrics.Register()
	os.Exit(m.Run())
}
