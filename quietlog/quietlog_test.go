package quietlog

import (
	"bytes"
	"flag"
	"fmt"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

const (
	keep = `action for Node "node-1" with CIDR "10.244.1.0/24": "keep"`
	add  = `action for Node "node-1" with CIDR "10.244.1.0/24": "add"`
)

func TestDemoted(t *testing.T) {
	for msg, want := range map[string]bool{
		keep: true,
		add:  false,
		`action for Node "n" with CIDR "c": "update"`: false,
		`route should be deleted, spec: exist: false`: false,
		`Created route for node n 10.244.1.0/24`:      false,
	} {
		if got := demoted(msg); got != want {
			t.Errorf("demoted(%q) = %v, want %v", msg, got, want)
		}
	}
}

// textSink is component-base's text format: a textlogger at verbosity v.
func textSink(v int) (logr.LogSink, *bytes.Buffer) {
	var out bytes.Buffer
	return textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(v), textlogger.Output(&out))).GetSink(), &out
}

func TestStructuredCalls(t *testing.T) {
	for _, verbose := range []bool{false, true} {
		inner, out := textSink(0)
		log := logr.New(wrap(inner, func() bool { return verbose }))
		log.Info(keep)
		log.Info(add)
		log.WithValues("k", "v").WithName("route").Info(keep)
		log.V(1).Info(keep) // not enabled at verbosity 0 either way
		got := out.String()
		if n, want := strings.Count(got, `\"keep\"`), map[bool]int{false: 0, true: 2}[verbose]; n != want {
			t.Errorf("verbose=%v: %d keep lines, want %d:\n%s", verbose, n, want, got)
		}
		if !strings.Contains(got, `\"add\"`) {
			t.Errorf("verbose=%v: the add line is missing:\n%s", verbose, got)
		}
		// The wrapper's own frame is skipped: the caller is this file.
		if !strings.Contains(got, "quietlog_test.go:") {
			t.Errorf("verbose=%v: the lines do not name their caller:\n%s", verbose, got)
		}
	}
}

func TestKlogBufferLines(t *testing.T) {
	for _, verbose := range []bool{false, true} {
		inner, out := textSink(0)
		w, ok := wrap(inner, func() bool { return verbose }).(textlogger.KlogBufferWriter)
		if !ok {
			t.Fatal("the text format's wrapper does not take klog's formatted lines")
		}
		line := func(sev byte, msg string) []byte {
			return fmt.Appendf(nil, "%c1125 04:10:00.123456    4711 route_controller.go:343] %s\n", sev, msg)
		}
		w.WriteKlogBuffer(line('I', keep))
		w.WriteKlogBuffer(line('I', add))
		w.WriteKlogBuffer(line('W', keep)) // only info lines are demoted
		w.WriteKlogBuffer(nil)
		want := string(line('I', add)) + string(line('W', keep))
		if verbose {
			want = string(line('I', keep)) + want
		}
		if out.String() != want {
			t.Errorf("verbose=%v: wrote\n%s\nwant\n%s", verbose, out.String(), want)
		}
	}
}

// Install through klog as component-base leaves it: klog.Infof, the
// upstream route controller's call, follows -v.
func TestInstall(t *testing.T) {
	inner, out := textSink(0)
	klog.SetLoggerWithOptions(logr.New(inner), klog.ContextualLogger(true),
		klog.WriteKlogBuffer(inner.(textlogger.KlogBufferWriter).WriteKlogBuffer))
	defer klog.ClearLogger()
	if !Install() {
		t.Fatal("Install found no logger to wrap")
	}
	klog.Infof("action for Node %q with CIDR %q: %q", "node-1", "10.244.1.0/24", "keep")
	klog.Infof("action for Node %q with CIDR %q: %q", "node-1", "10.244.1.0/24", "add")
	if got := out.String(); strings.Contains(got, `"keep"`) || !strings.Contains(got, `"add"`) {
		t.Errorf("at -v=0 wrote:\n%s\nwant the add line only", got)
	}

	// At -v=2 nothing is lost.
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	if err := fs.Set("v", "2"); err != nil {
		t.Fatal(err)
	}
	defer fs.Set("v", "0")
	out.Reset()
	klog.Infof("action for Node %q with CIDR %q: %q", "node-1", "10.244.1.0/24", "keep")
	if got := out.String(); !strings.Contains(got, `"keep"`) {
		t.Errorf("at -v=2 wrote %q, want the keep line", got)
	}

	// Without a logger (contextual logging off) there is nothing to wrap.
	klog.ClearLogger()
	if Install() {
		t.Error("Install wrapped klog's own output")
	}
}
