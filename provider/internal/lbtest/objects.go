package lbtest

import (
	"fmt"
	"net"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// Bridge is the load balancer's bridge.
const Bridge = "br-test"

// Node is one Node with a running domain that has a NIC on the bridge.
type Node struct {
	Name, UUID string
	MAC        net.HardwareAddr
}

// Nodes are the two Nodes, node-a and node-b.
func Nodes() []Node {
	return []Node{
		{"node-a", "aaaaaaaa-0000-0000-0000-000000000001", net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x0a}},
		{"node-b", "bbbbbbbb-0000-0000-0000-000000000002", net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x0b}},
	}
}

// Object is n as a Ready Node whose providerID names its domain (as
// provider.ProviderID does).
func (n Node) Object() *v1.Node {
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name},
		Spec:       v1.NodeSpec{ProviderID: "libvirt://" + n.UUID},
		Status: v1.NodeStatus{Conditions: []v1.NodeCondition{
			{Type: v1.NodeReady, Status: v1.ConditionTrue},
		}},
	}
}

// NodeOf says which of Nodes a MAC belongs to.
func NodeOf(mac net.HardwareAddr) (Node, bool) {
	for _, n := range Nodes() {
		if n.MAC.String() == mac.String() {
			return n, true
		}
	}
	return Node{}, false
}

// OtherNode is the one of Nodes that is not n.
func OtherNode(n Node) Node {
	for _, o := range Nodes() {
		if o.Name != n.Name {
			return o
		}
	}
	panic("one test node")
}

// Service is a LoadBalancer Service of namespace default, IPv4, port 80,
// then changed by mutate.
func Service(name string, mutate ...func(*v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: k8stypes.UID("uid-" + name)},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeLoadBalancer,
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
			Ports:      []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	for _, m := range mutate {
		m(s)
	}
	return s
}

// WithAnnotation sets annotation k to v.
func WithAnnotation(k, v string) func(*v1.Service) {
	return func(s *v1.Service) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[k] = v
	}
}

// WithStatusIP makes ip the Service's ingress, as the service controller
// writes it.
func WithStatusIP(ip string) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: ip, IPMode: ptr.To(v1.LoadBalancerIPModeVIP)}}
	}
}

// WithPort makes p the Service's one port.
func WithPort(p int32) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Spec.Ports = []v1.ServicePort{{Name: fmt.Sprintf("p%d", p), Port: p, Protocol: v1.ProtocolTCP}}
	}
}

// LocalPolicy gives the Service externalTrafficPolicy Local.
func LocalPolicy(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal }

// EndpointSlice is Service svc's slice with an endpoint on each node of
// ready, ready or not as it says.
func EndpointSlice(svc string, ready map[string]bool) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: svc + "-abc", Namespace: "default",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	i := 0
	for node, r := range ready {
		i++
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.244.0.%d", i)},
			NodeName:   ptr.To(node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(r)},
		})
	}
	return es
}
