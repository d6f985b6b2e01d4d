package provider

import (
	"context"
	"maps"
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// A replica that does not lead routes its own bridge from the Nodes it
// watches, as the route controller would: every pod CIDR it may route, via
// the Node's InternalIP of the family; a Node's change is followed; a
// halted follower writes no more.
func TestRouteFollower(t *testing.T) {
	table := newFakeTable()
	r := &routes{bridge: "br-test", table: table, cluster: rtCluster}
	a := rtNode("a", []string{"10.244.1.0/24", "fd10:244:1::/64"}, "10.88.0.11", "fd00:88::11")
	outside := rtNode("b", []string{"192.168.7.0/24"}, "10.88.0.12") // outside --cluster-cidr
	client := fake.NewClientset(a, outside)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	factory := replicaInformers(client)
	f, err := r.follow(ctx, factory.Core().V1().Nodes())
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())

	routed := func(want map[netip.Prefix]netip.Addr) string {
		deadline := time.Now().Add(5 * time.Second)
		for {
			table.mu.Lock()
			got := maps.Clone(table.routes)
			table.mu.Unlock()
			if maps.Equal(got, want) {
				return ""
			}
			if time.Now().After(deadline) {
				return "routes " + showRoutes(got) + ", want " + showRoutes(want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	want := map[netip.Prefix]netip.Addr{
		netip.MustParsePrefix("10.244.1.0/24"):   netip.MustParseAddr("10.88.0.11"),
		netip.MustParsePrefix("fd10:244:1::/64"): netip.MustParseAddr("fd00:88::11"),
	}
	if msg := routed(want); msg != "" {
		t.Fatal(msg)
	}
	c := rtNode("c", []string{"10.244.3.0/24"}, "10.88.0.13")
	if _, err := client.CoreV1().Nodes().Create(ctx, c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want[netip.MustParsePrefix("10.244.3.0/24")] = netip.MustParseAddr("10.88.0.13")
	if msg := routed(want); msg != "" {
		t.Fatalf("after Node c joined: %s", msg)
	}
	f.Halt()
	if err := client.CoreV1().Nodes().Delete(ctx, "c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if msg := routed(want); msg != "" {
		t.Fatalf("a halted follower wrote: %s", msg)
	}
}

func showRoutes(m map[netip.Prefix]netip.Addr) string {
	s := "{"
	for d, g := range m {
		s += " " + d.String() + " via " + g.String()
	}
	return s + " }"
}
