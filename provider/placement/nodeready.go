package placement

import (
	"time"

	v1 "k8s.io/api/core/v1"
	nodeutil "k8s.io/component-helpers/node/util"
)

// A Node's Ready condition, as placement reads it.

func nodeReady(n *v1.Node) bool { return readyStatus(n) == v1.ConditionTrue }

// readyUnknown: kube-controller-manager has not heard from the Node's
// kubelet within its grace period (or the kubelet never reported).
func readyUnknown(n *v1.Node) bool { return readyStatus(n) == v1.ConditionUnknown }

// readyCondition is the Node's Ready condition; an empty one without it.
func readyCondition(n *v1.Node) v1.NodeCondition {
	if _, c := nodeutil.GetNodeCondition(&n.Status, v1.NodeReady); c != nil {
		return *c
	}
	return v1.NodeCondition{}
}

// readyStatus is the status of the Node's Ready condition; "" without one.
func readyStatus(n *v1.Node) v1.ConditionStatus { return readyCondition(n).Status }

// readyHeartbeat is the Ready condition's heartbeat (the kubelet's clock).
func readyHeartbeat(n *v1.Node) time.Time { return readyCondition(n).LastHeartbeatTime.Time }

// readyChanged is when the Node's Ready condition last changed status, by
// the clock of whoever changed it (for Unknown, kube-controller-manager's).
func readyChanged(n *v1.Node) time.Time { return readyCondition(n).LastTransitionTime.Time }

// ReadyReport identifies the Node's last Ready report (status and
// heartbeat, compared as values, never against a clock): a new report is
// a new value, whatever the clocks.
func ReadyReport(n *v1.Node) string {
	c := readyCondition(n)
	if c.Type == "" {
		return ""
	}
	return string(c.Status) + "@" + c.LastHeartbeatTime.UTC().String()
}
