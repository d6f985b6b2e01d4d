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

	"k8s.io/client-go/tools/clientcmd"

	"github.com/labcloud/labcloud/lab/controlplane"
)

func TestWriteHostKubeconfig(t *testing.T) {
	dir := t.TempDir()
	admin, host := filepath.Join(dir, "admin.kubeconfig"), filepath.Join(dir, "kubeconfig")
	if err := controlplane.WriteKubeconfig(admin, "https://10.123.0.1:6443", []byte("CA"), "labcloud-admin", "tok"); err != nil {
		t.Fatal(err)
	}
	if err := writeHostKubeconfig(admin, host, "https://127.0.0.1:40000"); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(host)
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Clusters[cfg.Contexts[cfg.CurrentContext].Cluster]
	u := cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo]
	if c.Server != "https://127.0.0.1:40000" || string(c.CertificateAuthorityData) != "CA" || u.Token != "tok" {
		t.Errorf("host kubeconfig: server %s, CA %q, token %q", c.Server, c.CertificateAuthorityData, u.Token)
	}
	if a, _ := clientcmd.LoadFromFile(admin); a.Clusters["labcloud"].Server != "https://10.123.0.1:6443" {
		t.Error("the admin kubeconfig changed")
	}
}

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
