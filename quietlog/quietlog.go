// Package quietlog keeps the CCM's log quiet at steady state. Upstream
// controllers log some lines at level 0 on every pass over every object
// although nothing changed — the route controller's "action for Node …:
// keep" comes for each Node every reconcile (2 s here): ~3,000 lines a
// minute at 100 Nodes. Those lines are written only at -v=2 and above;
// every other line is untouched.
package quietlog

import (
	"bytes"
	"reflect"
	"strings"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// Verbosity is the level at which demoted lines are written.
const Verbosity = 2

// demoted says whether msg is one of the lines that report no change.
func demoted(msg string) bool {
	// k8s.io/cloud-provider/controllers/route: `action for Node %q with
	// CIDR %q: %q` with the action "keep".
	return strings.HasPrefix(msg, "action for Node ") && strings.HasSuffix(msg, `: "keep"`)
}

// Install wraps the logger that klog writes through (component-base sets
// it from --logging-format before the cloud provider is built) so demoted
// lines need -v=2. It returns false and changes nothing when klog writes
// without a logger (contextual logging disabled): klog's own output cannot
// be wrapped.
func Install() bool {
	logger := klog.Background()
	if reflect.TypeOf(logger.GetSink()) == reflect.TypeOf(klog.NewKlogr().GetSink()) {
		return false
	}
	opts := []klog.LoggerOption{klog.ContextualLogger(true)}
	s := wrap(logger.GetSink(), func() bool { return klog.V(Verbosity).Enabled() })
	if w, ok := s.(textlogger.KlogBufferWriter); ok {
		opts = append(opts, klog.WriteKlogBuffer(w.WriteKlogBuffer))
	}
	klog.SetLoggerWithOptions(logr.New(s), opts...)
	return true
}

// wrap returns a sink that writes through inner, except demoted lines
// unless verbose() says they are wanted.
func wrap(inner logr.LogSink, verbose func() bool) logr.LogSink {
	f := filter{inner: inner, verbose: verbose}
	if w, ok := inner.(textlogger.KlogBufferWriter); ok {
		return &bufferFilter{filter: f, write: w}
	}
	return &f
}

type filter struct {
	inner   logr.LogSink
	verbose func() bool
}

func (f *filter) rewrap(inner logr.LogSink) logr.LogSink { return wrap(inner, f.verbose) }

// Init adds this sink's frame to the call depth, so the file:line the
// inner sink reports is still the caller's.
func (f *filter) Init(info logr.RuntimeInfo) {
	info.CallDepth++
	f.inner.Init(info)
}

func (f *filter) Enabled(level int) bool { return f.inner.Enabled(level) }

func (f *filter) Info(level int, msg string, kv ...any) {
	if level < Verbosity && demoted(msg) && !f.verbose() {
		return
	}
	f.inner.Info(level, msg, kv...)
}

func (f *filter) Error(err error, msg string, kv ...any) { f.inner.Error(err, msg, kv...) }

func (f *filter) WithValues(kv ...any) logr.LogSink { return f.rewrap(f.inner.WithValues(kv...)) }

func (f *filter) WithName(name string) logr.LogSink { return f.rewrap(f.inner.WithName(name)) }

func (f *filter) WithCallDepth(depth int) logr.LogSink {
	if d, ok := f.inner.(logr.CallDepthLogSink); ok {
		return f.rewrap(d.WithCallDepth(depth))
	}
	return f
}

// bufferFilter is filter for the text format, where klog's own calls
// (klog.Infof) arrive as whole formatted lines.
type bufferFilter struct {
	filter
	write textlogger.KlogBufferWriter
}

func (f *bufferFilter) WriteKlogBuffer(line []byte) {
	// "I1125 04:10:00.123456    4711 file.go:343] message\n"
	if len(line) > 0 && line[0] == 'I' && !f.verbose() {
		if _, msg, ok := bytes.Cut(line, []byte("] ")); ok && demoted(string(bytes.TrimSuffix(msg, []byte("\n")))) {
			return
		}
	}
	f.write.WriteKlogBuffer(line)
}
