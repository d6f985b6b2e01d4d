// Package nodeconfig is the configuration file of lab-node: what a lab guest
// needs to join the control plane. The lab writes it into the guest's
// initramfs (lab/image); lab-node reads it at start.
package nodeconfig

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// DefaultPath is where the guest image puts the configuration.
const DefaultPath = "/etc/lab-node/config.json"

// Config is the content of /etc/lab-node/config.json.
type Config struct {
	// NodeName is the name of the Node object lab-node registers.
	NodeName string `json:"nodeName"`
	// APIServer is the https URL of the kube-apiserver, reachable from the guest.
	APIServer string `json:"apiServer"`
	// CACertPEM holds the PEM certificate(s) that sign the API server's
	// serving certificate.
	CACertPEM string `json:"caCertPEM"`
	// Token is a bearer token for user system:node:<NodeName> in group
	// system:nodes. It is never logged.
	Token string `json:"token"`
	// Labels are extra labels set when the Node is created. Labels under
	// kubernetes.io/ and k8s.io/ that NodeRestriction forbids are rejected
	// by the API server, not here.
	Labels map[string]string `json:"labels,omitempty"`
}

// Validate checks every field and names the first bad one.
func (c Config) Validate() error {
	var errs []error
	if msgs := validation.IsDNS1123Subdomain(c.NodeName); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("nodeName %q: %s", c.NodeName, strings.Join(msgs, "; ")))
	}
	if u, err := url.Parse(c.APIServer); err != nil {
		errs = append(errs, fmt.Errorf("apiServer %q: %w", c.APIServer, err))
	} else if u.Scheme != "https" || u.Host == "" {
		errs = append(errs, fmt.Errorf("apiServer %q: want an https URL with a host", c.APIServer))
	}
	if err := checkCA([]byte(c.CACertPEM)); err != nil {
		errs = append(errs, fmt.Errorf("caCertPEM: %w", err))
	}
	if c.Token == "" {
		errs = append(errs, errors.New("token: empty"))
	} else if strings.ContainsAny(c.Token, " \t\r\n") {
		errs = append(errs, errors.New("token: contains whitespace"))
	}
	return errors.Join(errs...)
}

func checkCA(data []byte) error {
	n := 0
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return fmt.Errorf("certificate %d: %w", n+1, err)
		}
		n++
	}
	if n == 0 {
		return errors.New("no PEM CERTIFICATE block")
	}
	return nil
}

// Marshal validates c and encodes it as indented JSON.
func (c Config) Marshal() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("invalid node config: %w", err)
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode node config: %w", err)
	}
	return append(b, '\n'), nil
}

// Parse decodes and validates a configuration. Unknown fields are errors,
// so a typo does not silently drop a setting.
func Parse(data []byte) (Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("decode node config: %w", err)
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("invalid node config: %w", err)
	}
	return c, nil
}

// Load reads and parses the configuration file at path.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read node config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// String describes c without the token, so a Config can be logged.
func (c Config) String() string {
	return fmt.Sprintf("{nodeName:%s apiServer:%s caCertPEM:%d bytes token:<redacted> labels:%v}",
		c.NodeName, c.APIServer, len(c.CACertPEM), c.Labels)
}
