package provider

import (
	"os"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/labcloud/labcloud/lb"
)

// FuzzLoadConfig: no cloud config makes the loader panic; one it accepts
// has pools the allocator accepts and loads back the same once written
// out; an error is short whatever the file's size.
func FuzzLoadConfig(f *testing.F) {
	for _, p := range []string{"../examples/cloud-config.yaml", "../packaging/cloud-config.yaml"} {
		if data, err := os.ReadFile(p); err == nil {
			f.Add(string(data))
		}
	}
	f.Add("loadBalancer: {bridge: br0, class: lb.labcloud.io/l2, serveClassless: false, pools: [{name: a, addresses: [10.0.0.0/30], namespaces: [team-a], namespaceSelector: {matchLabels: {tier: gold}}}]}")
	f.Add("loadBalancer: {bridge: br0, pools: [{name: a, addresses: [224.0.0.0/30]}]}")
	f.Add("hypervisors: [{uri: 'qemu+ssh://h/system'}]\nresyncPeriod: 1ms\nroutes: {bridge: br0, table: 255}")
	f.Add("region: \x00\nunknown: 1")
	f.Fuzz(func(t *testing.T, in string) {
		cfg, err := LoadConfig(strings.NewReader(in))
		if err != nil {
			return
		}
		if _, err := lb.NewPools(cfg.LoadBalancer.Pools); err != nil {
			t.Fatalf("accepted pools the allocator refuses: %v", err)
		}
		out, err := yaml.Marshal(cfg)
		if err != nil {
			t.Fatalf("marshal %+v: %v", cfg, err)
		}
		again, err := LoadConfig(strings.NewReader(string(out)))
		if err != nil {
			t.Fatalf("the written-out config is refused: %v\n%s", err, out)
		}
		if out2, _ := yaml.Marshal(again); string(out2) != string(out) {
			t.Fatalf("round trip changed the config:\n%s\n%s", out, out2)
		}
	})
}
