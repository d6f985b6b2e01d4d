package placement

import (
	"context"
	"maps"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// excludeLabel keeps a node out of load balancer pools, as upstream does.
const excludeLabel = "node.kubernetes.io/exclude-from-external-load-balancers"

// heartbeatSkew is how far a guest's clock may be ahead of the host's: a
// Node report that predates this process's watch counts from its own
// heartbeat time less this.
const heartbeatSkew = 2 * time.Second

// Lead makes this replica the one that places every VIP. From its start
// no follower's write lands on the announcer; it halts the follower
// (Follow), then registers the informers placement reads from factory,
// and their event handlers; recorder records the Services' events,
// client writes their Announced conditions. Run runs the passes.
func (p *Placement) Lead(ctx context.Context, factory informers.SharedInformerFactory, recorder record.EventRecorder, client kubernetes.Interface) error {
	p.answers.lead()
	if p.follower != nil {
		p.follower.Halt()
		p.follower = nil
	}
	if err := p.watch(factory, recorder, client); err != nil {
		return err
	}
	if p.here != nil {
		var zones []string
		for z, mine := range p.here {
			if mine {
				zones = append(zones, z)
			}
		}
		slices.Sort(zones)
		klog.FromContext(ctx).Info("Leading: placing every VIP, answering those of this host's nodes; each other host's replica answers its own nodes'", "zones", zones)
	}
	return nil
}

// watch registers the informers placement reads and its event handlers;
// client writes the Services' Announced condition.
func (p *Placement) watch(factory informers.SharedInformerFactory, recorder record.EventRecorder, client kubernetes.Interface) error {
	svcInf, nodeInf, sliceInf := factory.Core().V1().Services(), factory.Core().V1().Nodes(), factory.Discovery().V1().EndpointSlices()
	p.services, p.nodes, p.slices = svcInf.Lister(), nodeInf.Lister(), sliceInf.Lister()
	p.conds = newConditions(client, p.services)
	p.synced = []cache.InformerSynced{svcInf.Informer().HasSynced, nodeInf.Informer().HasSynced, sliceInf.Informer().HasSynced}
	p.recorder = recorder
	if _, err := nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    p.nodeAdded,
		UpdateFunc: p.nodeUpdated,
		DeleteFunc: func(o any) {
			if n, ok := o.(*v1.Node); ok {
				p.mu.Lock()
				delete(p.awaiting, n.Name)
				p.mu.Unlock()
			}
			p.poke()
		},
	}); err != nil {
		return err
	}
	// Endpoints move VIPs of Services with externalTrafficPolicy Local
	// only, and only when the nodes with a ready endpoint change: every
	// Pod's readiness anywhere in the cluster updates some EndpointSlice.
	_, err := sliceInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if p.localPolicy(o) {
				p.poke()
			}
		},
		UpdateFunc: func(o, n any) {
			old, ok1 := o.(*discoveryv1.EndpointSlice)
			cur, ok2 := n.(*discoveryv1.EndpointSlice)
			if !ok1 || !ok2 || p.localPolicy(cur) && !maps.Equal(readyNodes(old, nil), readyNodes(cur, nil)) {
				p.poke()
			}
		},
		DeleteFunc: func(o any) {
			if p.localPolicy(o) {
				p.poke()
			}
		},
	})
	return err
}

// nodeAdded counts a Node's report from before the watch from its own
// heartbeat (see reportAt).
func (p *Placement) nodeAdded(o any) {
	if n, ok := o.(*v1.Node); ok {
		p.mu.Lock()
		if _, seen := p.reportAt[n.Name]; !seen {
			if hb := readyHeartbeat(n); !hb.IsZero() {
				p.reportAt[n.Name] = hb.Add(-heartbeatSkew)
			}
		}
		p.mu.Unlock()
	}
	p.poke()
}

// nodeUpdated notes a new Ready report and starts a pass if the update
// changes what a pass reads, or is the report an awaiting Node lacked.
func (p *Placement) nodeUpdated(o, n any) {
	on, ok1 := o.(*v1.Node)
	nn, ok2 := n.(*v1.Node)
	if !ok1 || !ok2 {
		p.poke()
		return
	}
	awaited := false
	if ReadyReport(on) != ReadyReport(nn) {
		p.mu.Lock()
		p.reportAt[nn.Name] = time.Now()
		awaited = p.awaiting[nn.Name]
		p.mu.Unlock()
	}
	// Most Node updates change nothing a pass reads: heartbeats,
	// annotations (kube-controller-manager's TTL controller rewrites every
	// Node's as a cluster grows), other labels. A pass for each would keep
	// passes running back to back in a large cluster, each taking every
	// Node and dumping every VIP route.
	if awaited || placementInputsChanged(on, nn) {
		p.poke()
	}
}

// localPolicy says whether obj is an EndpointSlice of a LoadBalancer
// Service with externalTrafficPolicy Local, or something else that may
// matter (a tombstone). A Service not yet in the cache starts its own pass
// when the service controller ensures it.
func (p *Placement) localPolicy(obj any) bool {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return true
	}
	svc, err := p.services.Services(s.Namespace).Get(s.Labels[discoveryv1.LabelServiceName])
	return err == nil && svc.Spec.Type == v1.ServiceTypeLoadBalancer && svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
}

// placementInputsChanged says whether a Node update changes what a pass
// reads of the Node: its readiness (status, and when it last changed, which
// starts UnknownHold), the exclusion label, its deletion, and what finds
// its domain and next hop (provider ID, system UUID, addresses).
func placementInputsChanged(old, cur *v1.Node) bool {
	ro, rc := readyCondition(old), readyCondition(cur)
	_, exOld := old.Labels[excludeLabel]
	_, exCur := cur.Labels[excludeLabel]
	return ro.Status != rc.Status || !ro.LastTransitionTime.Equal(&rc.LastTransitionTime) ||
		exOld != exCur || (old.DeletionTimestamp == nil) != (cur.DeletionTimestamp == nil) ||
		old.Spec.ProviderID != cur.Spec.ProviderID || old.Status.NodeInfo.SystemUUID != cur.Status.NodeInfo.SystemUUID ||
		!slices.Equal(old.Status.Addresses, cur.Status.Addresses)
}

// readyNodes adds the nodes holding a ready endpoint of s to into (a new
// map if nil) and returns it.
func readyNodes(s *discoveryv1.EndpointSlice, into map[string]bool) map[string]bool {
	if into == nil {
		into = map[string]bool{}
	}
	for _, ep := range s.Endpoints {
		if ep.NodeName != nil && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) {
			into[*ep.NodeName] = true
		}
	}
	return into
}
