package nodeconfig

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func testCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func TestValidate(t *testing.T) {
	good := Config{NodeName: "lab-node-1", APIServer: "https://192.168.122.1:6443", CACertPEM: testCA(t), Token: "abc.def"}
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"no name", func(c *Config) { c.NodeName = "" }, "nodeName"},
		{"bad name", func(c *Config) { c.NodeName = "Node_1" }, "nodeName"},
		{"http", func(c *Config) { c.APIServer = "http://10.0.0.1:6443" }, "apiServer"},
		{"no host", func(c *Config) { c.APIServer = "https://" }, "apiServer"},
		{"no CA", func(c *Config) { c.CACertPEM = "" }, "caCertPEM: no PEM CERTIFICATE block"},
		{"bad CA", func(c *Config) {
			c.CACertPEM = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("junk")}))
		}, "caCertPEM: certificate 1"},
		{"no token", func(c *Config) { c.Token = "" }, "token: empty"},
		{"token with newline", func(c *Config) { c.Token = "abc\n" }, "token: contains whitespace"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.mutate(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestRoundTripAndLoad(t *testing.T) {
	c := Config{NodeName: "n1", APIServer: "https://10.0.0.1:6443", CACertPEM: testCA(t), Token: "s3cret",
		Labels: map[string]string{"lab.example/pool": "a"}}
	b, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if got.NodeName != c.NodeName || got.Token != c.Token || got.CACertPEM != c.CACertPEM || got.Labels["lab.example/pool"] != "a" {
		t.Errorf("Load = %v, want %v", got, c)
	}
	if _, err := Parse([]byte(`{"nodeName":"n1","tokn":"x"}`)); err == nil || !strings.Contains(err.Error(), "tokn") {
		t.Errorf("Parse(unknown field) = %v, want an error naming it", err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Error("Load(missing) succeeded")
	}
	for _, s := range []string{c.String(), fmt.Sprintf("%v", c), fmt.Sprintf("%+v", c)} {
		if strings.Contains(s, "s3cret") {
			t.Errorf("formatted config shows the token: %s", s)
		}
	}
}
