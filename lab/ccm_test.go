package lab

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labcloud/labcloud/lab/controlplane"
)

func TestCheckCCMServing(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "admin.kubeconfig")
	if err := controlplane.WriteKubeconfig(kc, "https://10.123.0.1:6443", []byte("CA"), "labcloud-admin", "admintoken"); err != nil {
		t.Fatal(err)
	}
	var metricsStatus atomic.Int32
	metricsStatus.Store(http.StatusForbidden)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/healthz":
			_, _ = io.WriteString(w, "ok")
		case r.URL.Path == "/metrics" && r.Header.Get("Authorization") == "Bearer admintoken":
			w.WriteHeader(int(metricsStatus.Load()))
		default:
			w.WriteHeader(http.StatusUnauthorized)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	err := checkCCMServing(ctx, kc, srv.URL, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "/metrics: 403") {
		t.Errorf("metrics forbidden: err = %v, want one naming /metrics and 403", err)
	}
	metricsStatus.Store(http.StatusOK)
	if err := checkCCMServing(ctx, kc, srv.URL, 5*time.Second); err != nil {
		t.Errorf("serving: %v", err)
	}
}
