package nodecni

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

func TestConflist(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cidrs   []string
		subnets []string
		routes  []string
		wantErr bool
	}{
		{name: "ipv4", cidrs: []string{"10.244.1.0/24"}, subnets: []string{"10.244.1.0/24"}, routes: []string{"0.0.0.0/0"}},
		{name: "dual", cidrs: []string{"10.244.1.0/24", "fd00:10:244:1::/64"},
			subnets: []string{"10.244.1.0/24", "fd00:10:244:1::/64"}, routes: []string{"0.0.0.0/0", "::/0"}},
		{name: "none", wantErr: true},
		{name: "garbage", cidrs: []string{"10.244.1.0"}, wantErr: true},
		{name: "host bits", cidrs: []string{"10.244.1.7/24"}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Conflist(tc.cidrs)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			var c struct {
				CNIVersion string `json:"cniVersion"`
				Plugins    []struct {
					Type   string `json:"type"`
					IPMasq *bool  `json:"ipMasq"`
					IPAM   struct {
						Ranges [][]struct {
							Subnet string `json:"subnet"`
						} `json:"ranges"`
						Routes []struct {
							Dst string `json:"dst"`
						} `json:"routes"`
					} `json:"ipam"`
				} `json:"plugins"`
			}
			if err := json.Unmarshal(b, &c); err != nil {
				t.Fatal(err)
			}
			if c.CNIVersion == "" || len(c.Plugins) != 2 || c.Plugins[0].Type != "bridge" || c.Plugins[1].Type != "portmap" {
				t.Fatalf("conflist = %s", b)
			}
			if m := c.Plugins[0].IPMasq; m == nil || *m {
				t.Errorf("ipMasq must be false (pod addresses are routed by the CCM): %s", b)
			}
			var subnets, routes []string
			for _, r := range c.Plugins[0].IPAM.Ranges {
				subnets = append(subnets, r[0].Subnet)
			}
			for _, r := range c.Plugins[0].IPAM.Routes {
				routes = append(routes, r.Dst)
			}
			if !equal(subnets, tc.subnets) || !equal(routes, tc.routes) {
				t.Errorf("subnets %v routes %v, want %v %v", subnets, routes, tc.subnets, tc.routes)
			}
		})
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestWriteOnlyOnChange(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "net.d")
	wrote, err := Write(dir, []string{"10.244.3.0/24"})
	if err != nil || !wrote {
		t.Fatalf("first Write = %v, %v; want a write", wrote, err)
	}
	wrote, err = Write(dir, []string{"10.244.3.0/24"})
	if err != nil || wrote {
		t.Fatalf("same CIDR again: Write = %v, %v; want no write", wrote, err)
	}
	wrote, err = Write(dir, []string{"10.244.4.0/24"})
	if err != nil || !wrote {
		t.Fatalf("new CIDR: Write = %v, %v; want a write", wrote, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, FileName))
	if err != nil || !json.Valid(b) {
		t.Fatalf("file %s: %v", b, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only %s", len(entries), FileName)
	}
}
