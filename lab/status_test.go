package lab

import (
	"bytes"
	"encoding/json"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/labcloud/labcloud/internal/frr"
	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/provider"
)

func lbSvc(name string, ips []string, conds ...metav1.Condition) *v1.Service {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer}}
	for _, ip := range ips {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip})
	}
	s.Status.Conditions = conds
	return s
}

// Status reads who answers, and since when, from the CCM's condition, and
// shows beside it what the host's neighbour table says.
func TestServiceRowsReadTheAnnouncedCondition(t *testing.T) {
	mac, _ := net.ParseMAC("52:54:00:7c:00:01")
	since := time.Date(2026, 11, 25, 4, 0, 0, 0, time.UTC)
	answered := lb.AnnouncedCondition([]lb.Answer{{VIP: netip.MustParseAddr("10.123.0.200"), Node: "lab-node-1", MAC: mac}})
	answered.LastTransitionTime = metav1.NewTime(since)
	none := lb.AnnouncedCondition([]lb.Answer{{VIP: netip.MustParseAddr("10.123.0.201")}})
	none.LastTransitionTime = metav1.NewTime(since)
	host := hostSide{
		neighbour: map[string]string{"10.123.0.200": "52:54:00:7c:00:02"}, // the wire disagrees
		routedVia: map[string][]string{"10.123.0.200": {"lab-node-1", "lab-node-2"}},
	}

	st := &Status{At: since.Add(3 * time.Minute)}
	for _, s := range []*v1.Service{
		lbSvc("web", []string{"10.123.0.200"}, answered),
		lbSvc("dark", []string{"10.123.0.201"}, none),
		lbSvc("new", []string{"10.123.0.202"}),
		lbSvc("pending", nil),
		{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "cluster-ip"}},
	} {
		st.Services = append(st.Services, serviceRows(s, host)...)
	}
	want := []ServiceStatus{
		{Service: "default/web", VIP: "10.123.0.200", Node: "lab-node-1", MAC: "52:54:00:7c:00:01", Since: &since, Placement: lb.ReasonAnnounced,
			HostNeighbour: "52:54:00:7c:00:02", RoutedVia: []string{"lab-node-1", "lab-node-2"}},
		{Service: "default/dark", VIP: "10.123.0.201", Since: &since, Placement: lb.ReasonNoEligibleNode},
		{Service: "default/new", VIP: "10.123.0.202", Placement: "no " + lb.ConditionAnnounced + " condition yet"},
		{Service: "default/pending", Placement: "no VIP yet"},
	}
	if len(st.Services) != len(want) {
		t.Fatalf("rows %+v, want %+v", st.Services, want)
	}
	for i, got := range st.Services {
		w := want[i]
		if got.Service != w.Service || got.VIP != w.VIP || got.Node != w.Node || got.MAC != w.MAC || got.Placement != w.Placement ||
			got.HostNeighbour != w.HostNeighbour || !slices.Equal(got.RoutedVia, w.RoutedVia) || (got.Since == nil) != (w.Since == nil) || (got.Since != nil && !got.Since.Equal(*w.Since)) {
			t.Errorf("row %d = %+v, want %+v", i, got, w)
		}
	}

	var out bytes.Buffer
	st.WriteTable(&out)
	for _, line := range []string{
		"default/web  10.123.0.200  lab-node-1   52:54:00:7c:00:01  3m ago  Announced  52:54:00:7c:00:02  lab-node-1,lab-node-2",
		"default/dark  10.123.0.201  -",
	} {
		if !strings.Contains(strings.Join(strings.Fields(out.String()), " "), strings.Join(strings.Fields(line), " ")) {
			t.Errorf("table lacks %q:\n%s", line, out.String())
		}
	}
}

// A condition whose message cannot be read says so instead of a node.
func TestServiceRowsBadCondition(t *testing.T) {
	c := metav1.Condition{Type: lb.ConditionAnnounced, Status: metav1.ConditionTrue, Reason: lb.ReasonAnnounced, Message: "garbage"}
	rows := serviceRows(lbSvc("web", []string{"10.123.0.200"}, c), hostSide{})
	if len(rows) != 1 || rows[0].Node != "" || !strings.Contains(rows[0].Placement, "garbage") {
		t.Errorf("rows %+v, want one without a node whose placement quotes the message", rows)
	}
}

func TestRouterRoutes(t *testing.T) {
	rib := map[netip.Prefix]frr.Route{
		netip.MustParsePrefix("10.244.1.0/24"):      {NextHops: []netip.Addr{netip.MustParseAddr("10.123.0.101")}, Selected: true},
		netip.MustParsePrefix("fd00:10:244:1::/64"): {NextHops: []netip.Addr{netip.MustParseAddr("fd00:10:123::101")}, Selected: true},
	}
	for _, tc := range []struct {
		cidrs []string
		want  string
	}{
		{[]string{"10.244.1.0/24"}, "via 10.123.0.101"},
		{[]string{"10.244.1.0/24", "fd00:10:244:1::/64"}, "10.244.1.0/24 via 10.123.0.101; fd00:10:244:1::/64 via fd00:10:123::101"},
		{[]string{"10.244.2.0/24"}, ""},
		{nil, ""},
	} {
		if got := routerRoutes(rib, tc.cidrs); got != tc.want {
			t.Errorf("routerRoutes(%v) = %q, want %q", tc.cidrs, got, tc.want)
		}
	}
}

// A node's row names its hypervisor's host, from the CCM's label; a Node
// the CCM has not labelled yet shows none.
func TestNodeRowsShowTheHost(t *testing.T) {
	labelled := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "lab-node-1", Labels: map[string]string{provider.LabelHost: "kvm-a"}},
		Status: v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}}}
	st := &Status{Nodes: []NodeStatus{nodeRow(labelled), nodeRow(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "lab-node-2"}})}}
	if st.Nodes[0].Host != "kvm-a" || st.Nodes[0].Ready != "True" || st.Nodes[1].Host != "" || st.Nodes[1].Ready != "Unknown" {
		t.Fatalf("rows %+v", st.Nodes)
	}

	var out bytes.Buffer
	st.WriteTable(&out)
	lines := strings.Split(out.String(), "\n")
	for i, want := range []string{"NODE HOST DOMAIN STATE READY", "lab-node-1 kvm-a - - True", "lab-node-2 - - - Unknown"} {
		if got := strings.Join(strings.Fields(lines[i]), " "); !strings.HasPrefix(got, want) {
			t.Errorf("table line %d = %q, want it to start with %q", i, got, want)
		}
	}
	data, err := json.Marshal(st.Nodes[0])
	if err != nil || !strings.Contains(string(data), `"host":"kvm-a"`) {
		t.Errorf("JSON %s, %v; want host kvm-a", data, err)
	}
}
