// Package explain says in one line what a Kubernetes object is stuck on:
// a Node's Ready condition, a pod's waiting containers, the latest Warning
// event about an object; shortened to fit an error message.
package explain

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// NodeNotReady says why the Node is not Ready: its Ready condition's
// reason and message, shortened; "" when it is Ready.
func NodeNotReady(n *v1.Node) string {
	for _, c := range n.Status.Conditions {
		if c.Type != v1.NodeReady {
			continue
		}
		if c.Status == v1.ConditionTrue {
			return ""
		}
		return Shorten(ReasonMessage(c.Reason, c.Message, "Ready is "+string(c.Status)), MaxLen)
	}
	return "no Ready condition yet"
}

// MaxLen bounds a condition's or event's message in an error: the
// cause fits in it, a runtime's whole stack does not.
const MaxLen = 300

// Shorten puts s on one line (runs of white space become one space) and
// cuts it to at most limit bytes, ending in "...", on a rune boundary.
func Shorten(s string, limit int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= limit {
		return s
	}
	cut := limit - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// ReasonMessage is "reason: message" of a condition or an event, or
// whichever of them is set, or otherwise when neither is.
func ReasonMessage(reason, message, otherwise string) string {
	switch {
	case reason != "" && message != "":
		return reason + ": " + message
	case reason != "":
		return reason
	case message != "":
		return message
	}
	return otherwise
}

// PodState is the pod's phase and, for each container not running yet,
// the reason it waits (its message, if any, is in the pod's events).
func PodState(p *v1.Pod) string {
	out := []string{cmp.Or(string(p.Status.Phase), "no phase yet")}
	for _, c := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
		if w := c.State.Waiting; w != nil {
			out = append(out, fmt.Sprintf("container %s waiting: %s", c.Name, cmp.Or(w.Reason, "no reason given")))
		}
	}
	return strings.Join(out, ", ")
}

// LatestWarning describes the most recent Warning event about the object
// of that kind and name (and uid, when given) in namespace.
func LatestWarning(ctx context.Context, client kubernetes.Interface, namespace, kind, name string, uid types.UID) string {
	sel := fields.Set{"involvedObject.kind": kind, "involvedObject.name": name, "type": v1.EventTypeWarning}
	if uid != "" {
		sel["involvedObject.uid"] = string(uid)
	}
	list, err := client.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: sel.AsSelector().String()})
	if err != nil {
		return "its events: " + err.Error()
	}
	e := newestWarning(list.Items, kind, name, uid)
	if e == nil {
		return "no Warning event"
	}
	return "last Warning event " + Shorten(ReasonMessage(e.Reason, e.Message, "with neither reason nor message"), MaxLen)
}

// newestWarning is the most recent Warning event about the object, nil
// when there is none. It filters as the field selector does: a server (or
// a fake) that ignored it must not blame the pod for another's event.
func newestWarning(events []v1.Event, kind, name string, uid types.UID) *v1.Event {
	var newest *v1.Event
	for i := range events {
		e := &events[i]
		o := e.InvolvedObject
		if e.Type != v1.EventTypeWarning || o.Kind != kind || o.Name != name || (uid != "" && o.UID != uid) {
			continue
		}
		if newest == nil || eventTime(e).After(eventTime(newest)) {
			newest = e
		}
	}
	return newest
}

// eventTime is when the event last happened: the kubelet's core/v1
// events set LastTimestamp, events.k8s.io ones EventTime and their
// series' LastObservedTime.
func eventTime(e *v1.Event) time.Time {
	t := e.LastTimestamp.Time
	if e.Series != nil && e.Series.LastObservedTime.After(t) {
		t = e.Series.LastObservedTime.Time
	}
	if e.EventTime.After(t) {
		t = e.EventTime.Time
	}
	if t.IsZero() {
		t = e.CreationTimestamp.Time
	}
	return t
}
