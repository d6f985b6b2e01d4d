package lab

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"k8s.io/client-go/kubernetes"

	"github.com/labcloud/labcloud/lab/controlplane"
	"github.com/labcloud/labcloud/provider"
)

// Light mode: no guests and no libvirtd. The CCM talks to libvirt's test
// driver, whose fixture holds one running domain per node, and a simulator
// process registers the Nodes as kubelets would. Only the API server's
// loopback address is used, so the namespace needs no bridge.
const (
	MaxLightNodes = 10000
	// The fixture's network: the test driver's guest agent answers with an
	// address derived from it (network + 2 + 20*(id-1)), so a /12 keeps
	// MaxLightNodes addresses distinct.
	lightNetAddr, lightNetMask = "10.208.0.1", "255.240.0.0"
	// LightZone is the zone of every light lab's node.
	LightZone = "lab-host"
	// SimulatorPid is the State.Pids key of the simulator process.
	SimulatorPid = "simulator"
)

// lightNodeName names node i (1-based) of n, zero-padded so that names sort
// in node order.
func lightNodeName(i, n int) string {
	return fmt.Sprintf("%s%0*d", NodePrefix, len(strconv.Itoa(n)), i)
}

// fixtureUUID is the UUID of node i's domain, which the simulated node
// reports as its system UUID.
func fixtureUUID(i int) string { return fmt.Sprintf("1abc0000-0000-4000-8000-%012d", i) }

// LightNode is node i (1-based) of a light lab of n: its name and its
// domain's UUID.
func LightNode(i, n int) (name, systemUUID string) { return lightNodeName(i, n), fixtureUUID(i) }

func fixturePath(dir string) string { return filepath.Join(dir, "fixture.xml") }

// LibvirtURI is the hypervisor the lab's CCM (and status) talks to.
func (s *State) LibvirtURI() string {
	if s.Light {
		return "test://" + fixturePath(s.Dir)
	}
	return labURI
}

// writeFixture writes a test-driver fixture of n running domains, one per
// light-mode node, in a format libvirt 9.0 accepts.
func writeFixture(path string, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("test-driver fixture: %w", err)
	}
	w := bufio.NewWriter(f)
	fmt.Fprintf(w, `<node>
  <cpu><mhz>2000</mhz><model>x86_64</model><active>64</active><total>64</total><nodes>1</nodes><sockets>1</sockets><cores>64</cores><threads>1</threads></cpu>
  <memory>1073741824</memory>
  <network><name>%s</name><uuid>1abc0000-0000-4000-8000-ffffffffffff</uuid><bridge name='%s'/><forward mode='route'/><ip address='%s' netmask='%s'/></network>
`, NetworkName, Bridge, lightNetAddr, lightNetMask)
	for i := 1; i <= n; i++ {
		fmt.Fprintf(w, `  <domain type='test'><name>%s</name><uuid>%s</uuid><memory>2097152</memory><currentMemory>2097152</currentMemory><vcpu>2</vcpu><os><type arch='x86_64'>hvm</type></os><devices><interface type='network'><mac address='%s'/><source network='%s'/></interface></devices></domain>
`, lightNodeName(i, n), fixtureUUID(i), nodeMAC(i), NetworkName)
	}
	fmt.Fprintln(w, "</node>")
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("test-driver fixture %s: %w", path, err)
	}
	return f.Close()
}

// WriteFixture records the light lab's n nodes and writes the test
// driver's fixture of their domains.
func (s *State) WriteFixture(n int) error {
	for i := 1; i <= n; i++ {
		s.Nodes = append(s.Nodes, lightNodeName(i, n))
	}
	return writeFixture(fixturePath(s.Dir), n)
}

// lightCloudConfig: the test driver keeps no DHCP leases, but its guest
// agent answers; no routes and no load balancers without a bridge.
func lightCloudConfig(st *State) provider.Config {
	cfg := provider.DefaultConfig()
	cfg.Region = "lab"
	cfg.Host = labHost
	cfg.Hypervisors = []provider.HypervisorConfig{{URI: st.LibvirtURI(), Zone: LightZone, Host: labHost}}
	cfg.AddressSources = []string{provider.SourceGuestAgent}
	return cfg
}

func (u *upRun) startLightCCM(ctx context.Context, cp *controlplane.ControlPlane, client kubernetes.Interface, bin string) error {
	// As shipped: without a bridge in the cloud config the provider offers
	// no routes and no load balancers, and those controllers stay idle.
	data, err := marshalCloudConfig(lightCloudConfig(u.st))
	if err != nil {
		return err
	}
	return u.runCCM(ctx, cp, client, bin, data)
}

// WriteSummary writes the status table, or for more than rows nodes a
// summary line and the table of the first rows nodes.
func (s *Status) WriteSummary(w io.Writer, rows int) {
	if len(s.Nodes) <= rows {
		s.WriteTable(w)
		return
	}
	var ready, initialized int
	for _, n := range s.Nodes {
		if n.Ready == "True" {
			ready++
		}
		if n.ProviderID != "" {
			initialized++
		}
	}
	fmt.Fprintf(w, "%d nodes: %d Ready, %d with a providerID; the first %d (labcloud status lists them all):\n\n", len(s.Nodes), ready, initialized, rows)
	head := *s
	head.Nodes = s.Nodes[:rows]
	head.WriteTable(w)
}
