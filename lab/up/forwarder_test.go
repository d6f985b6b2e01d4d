package up

import (
	"path/filepath"
	"testing"

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
