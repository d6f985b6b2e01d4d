package main

import (
	"testing"

	"github.com/labcloud/labcloud/lab/nodeagent/nodeconfig"
)

func TestRestConfig(t *testing.T) {
	cfg := nodeconfig.Config{NodeName: "n1", APIServer: "https://10.0.0.1:6443", CACertPEM: "PEM", Token: "tok"}
	rc := restConfig(cfg)
	if rc.Host != cfg.APIServer || rc.BearerToken != "tok" || string(rc.TLSClientConfig.CAData) != "PEM" {
		t.Errorf("restConfig = %+v", rc)
	}
	if rc.TLSClientConfig.Insecure || rc.Username != "" || rc.BearerTokenFile != "" {
		t.Errorf("restConfig must verify the server with the CA and use only the token: %+v", rc)
	}
}
