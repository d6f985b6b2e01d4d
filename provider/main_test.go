package provider

import (
	"testing"

	"github.com/labcloud/labcloud/provider/internal/lbtest"
)

// TestMain registers labcloud's metrics before any test runs (lbtest.Main).
func TestMain(m *testing.M) { lbtest.Main(m) }
