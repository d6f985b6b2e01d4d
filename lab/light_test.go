package lab

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"libvirt.org/go/libvirt"
)

func TestLightNodeName(t *testing.T) {
	for _, tt := range []struct {
		i, n int
		want string
	}{
		{1, 1, "lab-node-1"},
		{7, 200, "lab-node-007"},
		{200, 200, "lab-node-200"},
		{42, 1000, "lab-node-0042"},
		{10000, 10000, "lab-node-10000"},
	} {
		if got := lightNodeName(tt.i, tt.n); got != tt.want {
			t.Errorf("lightNodeName(%d, %d) = %q, want %q", tt.i, tt.n, got, tt.want)
		}
	}
}

// The fixture must load in the test driver with one running domain per
// node, named and identified as the simulator's nodes, each with its own
// guest-agent address (the CCM's only address source in light mode).
func TestWriteFixture(t *testing.T) {
	const n = 120
	path := filepath.Join(t.TempDir(), "fixture.xml")
	if err := writeFixture(path, n); err != nil {
		t.Fatal(err)
	}
	c, err := libvirt.NewConnect("test://" + path)
	if err != nil {
		t.Fatalf("test driver rejects the fixture: %v", err)
	}
	defer c.Close()
	doms, err := c.ListAllDomains(libvirt.CONNECT_LIST_DOMAINS_RUNNING)
	if err != nil {
		t.Fatal(err)
	}
	if len(doms) != n {
		t.Fatalf("%d running domains, want %d", len(doms), n)
	}
	seen := map[string]string{}
	for _, d := range doms {
		name, _ := d.GetName()
		uuid, _ := d.GetUUIDString()
		var i int
		if _, err := fmt.Sscanf(strings.TrimPrefix(name, NodePrefix), "%d", &i); err != nil || lightNodeName(i, n) != name {
			t.Errorf("domain %q is not named like a simulated node", name)
		}
		if uuid != fixtureUUID(i) {
			t.Errorf("domain %s UUID %s, want %s", name, uuid, fixtureUUID(i))
		}
		ifaces, err := d.ListAllInterfaceAddresses(libvirt.DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT)
		if err != nil || len(ifaces) != 1 || len(ifaces[0].Addrs) == 0 {
			t.Fatalf("domain %s agent addresses: %+v %v", name, ifaces, err)
		}
		addr := ifaces[0].Addrs[0].Addr
		if other, dup := seen[addr]; dup {
			t.Errorf("domains %s and %s share the agent address %s", name, other, addr)
		}
		seen[addr] = name
		d.Free()
	}
}

func TestWriteSummary(t *testing.T) {
	s := &Status{}
	for i := 1; i <= 25; i++ {
		ready := "True"
		if i == 3 {
			ready = "False"
		}
		s.Nodes = append(s.Nodes, NodeStatus{Name: lightNodeName(i, 25), Ready: ready, ProviderID: "libvirt://" + fixtureUUID(i)})
	}
	var b bytes.Buffer
	s.WriteSummary(&b, 20)
	out := b.String()
	for _, want := range []string{"25 nodes: 24 Ready, 25 with a providerID; the first 20 (labcloud status lists them all):", "lab-node-20 "} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "lab-node-21") {
		t.Errorf("summary shows more than 20 rows:\n%s", out)
	}
	b.Reset()
	(&Status{Nodes: s.Nodes[:2]}).WriteSummary(&b, 20)
	if strings.Contains(b.String(), "nodes:") || !strings.Contains(b.String(), "lab-node-02") {
		t.Errorf("a small lab gets the plain table:\n%s", b.String())
	}
}
