// Package docs holds the test that keeps the documents in step with the
// code: docs/reference.md must name every metric, event reason, annotation,
// label, condition, cloud-config field and flag default the code has, and
// no document (README.md, CONTRIBUTING.md, docs/*.md) may name one the code
// does not have, nor link to a file or heading that does not exist. Names
// are read from the code (go/ast over the sources, reflection over
// provider.Config, upstream's flag set), never from a list kept here.
package docs

import (
	"encoding"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	nodecontroller "k8s.io/cloud-provider/controllers/node"
	"k8s.io/cloud-provider/options"
	"k8s.io/component-base/metrics/legacyregistry"
	"sigs.k8s.io/yaml"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
	"github.com/labcloud/labcloud/metrics"
	"github.com/labcloud/labcloud/netroutes"
	"github.com/labcloud/labcloud/provider"
)

// docFiles are the documents whose names and links are checked against the
// code (relative to the repository root): the front page, the contributor's
// guide and every Markdown file in docs/. reference.md must also be complete.
var docFiles = func() []string {
	files := []string{"README.md", "CONTRIBUTING.md"}
	found, err := filepath.Glob("*.md")
	if err != nil {
		panic(err)
	}
	for _, f := range found {
		files = append(files, "docs/"+f)
	}
	return files
}()

const reference = "docs/reference.md"

// TestDocFilesFound: the documents the other tests read exist, so that a
// renamed or moved file cannot leave them checking nothing.
func TestDocFilesFound(t *testing.T) {
	for _, f := range []string{"README.md", "CONTRIBUTING.md", reference, "docs/how-it-works.md",
		"docs/troubleshooting.md", "docs/install-kubeadm.md", "docs/lab.md", "docs/conformance.md", "docs/performance.md"} {
		if !slices.Contains(docFiles, f) {
			t.Errorf("%s is not among the documents checked (%v)", f, docFiles)
		}
		readDoc(t, f)
	}
}

// ---------------------------------------------------------------- metrics

func TestMetricsDocumented(t *testing.T) {
	code := codeMetrics(t)
	ref := readDoc(t, reference)
	sec := section(t, ref, "Metrics")

	documented := map[string]bool{}
	for _, tb := range tables(sec) {
		if !isMetricTable(tb) {
			continue
		}
		for _, row := range tb.rows {
			name := firstSpan(row[0])
			documented[name] = true
			checkMetricRow(t, reference, code, row)
		}
	}
	for name := range code {
		if !documented[name] {
			t.Errorf("%s: metric %s is registered by package metrics but has no row in the Metrics table", reference, name)
		}
	}
	// Label values the code defines (metrics.Move*, metrics.Op*).
	spans := spanSet(sec)
	for name, value := range parsePkg(t, "metrics").exportedStrings() {
		if !spans[value] {
			t.Errorf("%s: the Metrics section does not name the label value %q (metrics.%s)", reference, value, name)
		}
	}

	// Every document: every labcloud_* name is a metric, and every metric
	// table row agrees with the code.
	name := regexp.MustCompile(`\blabcloud_[a-z0-9_]*[a-z0-9]\b`)
	for _, f := range docFiles {
		text := readDoc(t, f)
		for _, m := range name.FindAllString(text, -1) {
			if !isMetric(code, m) {
				t.Errorf("%s names metric %s, which the code does not register", f, m)
			}
		}
		if f == reference {
			continue
		}
		for _, tb := range tables(text) {
			if isMetricTable(tb) {
				for _, row := range tb.rows {
					checkMetricRow(t, f, code, row)
				}
			}
		}
	}
}

func isMetricTable(tb table) bool {
	return len(tb.header) >= 3 && tb.header[0] == "name" && tb.header[1] == "type" && tb.header[2] == "labels"
}

func checkMetricRow(t *testing.T, file string, code map[string]metricInfo, row []string) {
	t.Helper()
	if len(row) < 3 {
		t.Errorf("%s: metric row %q has fewer than 3 cells", file, row)
		return
	}
	name := firstSpan(row[0])
	m, ok := code[name]
	if !ok {
		t.Errorf("%s: metric row %q: no such metric is registered", file, name)
		return
	}
	if typ := strings.TrimSpace(row[1]); typ != m.typ {
		t.Errorf("%s: metric %s is documented as a %s, the code makes a %s", file, name, typ, m.typ)
	}
	labels := spans(row[2])
	slices.Sort(labels)
	want := slices.Sorted(slices.Values(m.labels))
	if !slices.Equal(labels, want) {
		t.Errorf("%s: metric %s is documented with labels %v, the code gives it %v", file, name, labels, want)
	}
}

func isMetric(code map[string]metricInfo, name string) bool {
	if _, ok := code[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if m, ok := code[strings.TrimSuffix(name, suffix)]; ok && strings.HasSuffix(name, suffix) && m.typ == "histogram" {
			return true
		}
	}
	return false
}

type metricInfo struct {
	typ    string // counter, gauge, histogram
	labels []string
}

// codeMetrics reads package metrics: the variables metrics.Register passes
// to MustRegister, each with its name, type and labels from its options.
func codeMetrics(t *testing.T) map[string]metricInfo {
	t.Helper()
	p := parsePkg(t, "metrics")
	byVar := map[string]struct {
		name string
		info metricInfo
	}{}
	p.values(token.VAR, func(name string, v ast.Expr) {
		call, ok := v.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 {
			return
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || !strings.HasPrefix(sel.Sel.Name, "New") {
			return
		}
		var typ string
		for _, k := range []string{"Counter", "Gauge", "Histogram", "Summary"} {
			if strings.Contains(sel.Sel.Name, k) {
				typ = strings.ToLower(k)
			}
		}
		opts := compositeFields(call.Args[0])
		if typ == "" || opts == nil {
			return
		}
		var parts []string
		for _, k := range []string{"Namespace", "Subsystem", "Name"} {
			if e, ok := opts[k]; ok {
				s, ok := p.evalString(e)
				if !ok {
					t.Fatalf("metrics: cannot read %s of %s", k, name)
				}
				if s != "" {
					parts = append(parts, s)
				}
			}
		}
		info := metricInfo{typ: typ}
		if len(call.Args) > 1 {
			lit, ok := call.Args[1].(*ast.CompositeLit)
			if !ok {
				t.Fatalf("metrics: cannot read the labels of %s", name)
			}
			for _, e := range lit.Elts {
				s, ok := p.evalString(e)
				if !ok {
					t.Fatalf("metrics: cannot read a label of %s", name)
				}
				info.labels = append(info.labels, s)
			}
		}
		byVar[name] = struct {
			name string
			info metricInfo
		}{strings.Join(parts, "_"), info}
	})
	out := map[string]metricInfo{}
	for _, f := range p.files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Name.Name != "Register" || fd.Recv != nil {
				continue
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				if sel, ok := call.Fun.(*ast.SelectorExpr); !ok || sel.Sel.Name != "MustRegister" {
					return true
				}
				for _, a := range call.Args {
					v, known := byVar[exprName(a)]
					if !known {
						t.Fatalf("metrics.Register registers %s, which this test cannot read", exprName(a))
					}
					out[v.name] = v.info
				}
				return true
			})
		}
	}
	if len(out) == 0 {
		t.Fatal("found no metric registered by metrics.Register")
	}
	// What the registry holds after Register (vectors only once they have
	// a child) must be among what was read from the source.
	metrics.Register()
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if n := mf.GetName(); strings.HasPrefix(n, "labcloud_") {
			if _, ok := out[n]; !ok {
				t.Fatalf("the registry holds %s, which this test did not read from package metrics", n)
			}
		}
	}
	return out
}

// ---------------------------------------------------------------- events

func TestEventReasonsDocumented(t *testing.T) {
	code := codeEventReasons(t)
	if len(code) == 0 {
		t.Fatal("found no event reason in provider/")
	}

	// reference.md: the table of labcloud's reasons.
	ref := readDoc(t, reference)
	sec := section(t, ref, "Event reasons")
	var found bool
	documented := map[string]bool{}
	for _, tb := range tables(sec) {
		if len(tb.header) < 4 || tb.header[0] != "reason" || tb.header[1] != "type" || !slices.Contains(tb.header, "message") {
			continue
		}
		found = true
		msgCol := slices.Index(tb.header, "message")
		for _, row := range tb.rows {
			reason := firstSpan(row[0])
			documented[reason] = true
			r, ok := code[reason]
			if !ok {
				t.Errorf("%s documents event reason %q, which provider/ does not record", reference, reason)
				continue
			}
			if got, want := typesOf(row[1]), r.typeList(); !slices.Equal(got, want) {
				t.Errorf("%s: event %s is documented as %v, provider/ records it as %v", reference, reason, got, want)
			}
			examples := spans(row[msgCol])
			for _, format := range r.formats {
				re := formatRegexp(format)
				if !slices.ContainsFunc(examples, re.MatchString) {
					t.Errorf("%s: no example message of event %s matches the code's format %q (examples: %q)", reference, reason, format, examples)
				}
			}
		}
	}
	if !found {
		t.Fatalf("%s: no table with columns reason, type, ..., message under Event reasons", reference)
	}
	for reason := range code {
		if !documented[reason] {
			t.Errorf("%s: event reason %s is recorded by provider/ but not documented", reference, reason)
		}
	}

	// troubleshooting.md: one heading per reason, with its type.
	const ts = "docs/troubleshooting.md"
	tsec := section(t, readDoc(t, ts), "Event reasons")
	heading := regexp.MustCompile(`(?m)^### (.*)$`)
	seen := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(tsec, -1) {
		names := spans(m[1])
		if len(names) == 0 || strings.Contains(m[1], "Upstream") {
			continue
		}
		for _, reason := range names {
			seen[reason] = true
			r, ok := code[reason]
			if !ok {
				t.Errorf("%s has a section for event reason %q, which provider/ does not record", ts, reason)
				continue
			}
			if got, want := typesOf(m[1]), r.typeList(); !slices.Equal(got, want) {
				t.Errorf("%s: event %s is headed %v, provider/ records it as %v", ts, reason, got, want)
			}
		}
	}
	for reason := range code {
		if !seen[reason] {
			t.Errorf("%s: no section for event reason %s", ts, reason)
		}
	}
}

type reasonInfo struct {
	types   map[string]bool // Normal, Warning
	formats []string        // Eventf formats it is recorded with
}

func (r *reasonInfo) typeList() []string {
	return slices.Sorted(func(yield func(string) bool) {
		for k := range r.types {
			if !yield(k) {
				return
			}
		}
	})
}

func typesOf(s string) []string {
	var out []string
	for _, k := range []string{"Normal", "Warning"} {
		if strings.Contains(s, k) {
			out = append(out, k)
		}
	}
	return out
}

// codeEventReasons finds the event reasons of provider/: string constants
// named Reason* or Event*, each with the event types it is recorded with.
// A reason is recorded when it follows v1.EventType{Normal,Warning} in a
// call's arguments, directly, through a local variable, or through a
// function that passes its parameter on that way (warnOnce).
func codeEventReasons(t *testing.T) map[string]*reasonInfo {
	t.Helper()
	p := parsePkg(t, "provider")
	consts := map[string]string{} // Go name → reason
	isReason := regexp.MustCompile(`^(Reason|Event)[A-Z]`)
	for name, v := range p.consts {
		if isReason.MatchString(name) {
			consts[name] = v
		}
	}
	out := map[string]*reasonInfo{}
	for _, v := range consts {
		out[v] = &reasonInfo{types: map[string]bool{}}
	}
	type forwarder struct {
		param int
		typ   string
	}
	forwarders := map[string]forwarder{} // function name → what it forwards

	// locals maps a function's variables to the reason constants assigned to them.
	locals := func(fd *ast.FuncDecl) map[string][]string {
		m := map[string][]string{}
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			if as, ok := n.(*ast.AssignStmt); ok && len(as.Lhs) == len(as.Rhs) {
				for i, l := range as.Lhs {
					if li, ok := l.(*ast.Ident); ok {
						if ri, ok := as.Rhs[i].(*ast.Ident); ok && consts[ri.Name] != "" {
							m[li.Name] = append(m[li.Name], ri.Name)
						}
					}
				}
			}
			return true
		})
		return m
	}
	params := func(fd *ast.FuncDecl) []string {
		var names []string
		for _, f := range fd.Type.Params.List {
			for _, n := range f.Names {
				names = append(names, n.Name)
			}
		}
		return names
	}
	// record notes that expression e, in function fd, is recorded as typ;
	// it reports whether e was a reason (constant or local variable).
	record := func(fd *ast.FuncDecl, loc map[string][]string, e ast.Expr, typ string) bool {
		id, ok := e.(*ast.Ident)
		if !ok {
			return false
		}
		if v, ok := consts[id.Name]; ok {
			out[v].types[typ] = true
			return true
		}
		if names, ok := loc[id.Name]; ok {
			for _, n := range names {
				out[consts[n]].types[typ] = true
			}
			return true
		}
		if i := slices.Index(params(fd), id.Name); i >= 0 {
			forwarders[fd.Name.Name] = forwarder{param: i, typ: typ}
		}
		return false
	}
	funcs := p.funcs()
	for _, fd := range funcs {
		loc := locals(fd)
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			for i, a := range call.Args {
				typ := eventType(a)
				if typ == "" || i+1 >= len(call.Args) {
					continue
				}
				if record(fd, loc, call.Args[i+1], typ) && i+2 < len(call.Args) {
					if lit, ok := call.Args[i+2].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						if id, ok := call.Args[i+1].(*ast.Ident); ok && consts[id.Name] != "" {
							format, _ := strconv.Unquote(lit.Value)
							r := out[consts[id.Name]]
							if !slices.Contains(r.formats, format) {
								r.formats = append(r.formats, format)
							}
						}
					}
				}
			}
			return true
		})
	}
	for _, fd := range funcs {
		loc := locals(fd)
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			fw, ok := forwarders[calledName(call)]
			if ok && fw.param < len(call.Args) {
				record(fd, loc, call.Args[fw.param], fw.typ)
			}
			return true
		})
	}
	for name, v := range consts {
		if len(out[v].types) == 0 {
			t.Errorf("provider.%s (%q) is never recorded as an event (or this test cannot see how)", name, v)
		}
	}
	return out
}

func eventType(e ast.Expr) string {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return ""
	}
	switch sel.Sel.Name {
	case "EventTypeNormal":
		return "Normal"
	case "EventTypeWarning":
		return "Warning"
	}
	return ""
}

func calledName(call *ast.CallExpr) string {
	switch f := call.Fun.(type) {
	case *ast.Ident:
		return f.Name
	case *ast.SelectorExpr:
		return f.Sel.Name
	}
	return ""
}

// formatRegexp matches what a printf format produces, any value for each verb.
func formatRegexp(format string) *regexp.Regexp {
	verb := regexp.MustCompile(`%[-+# 0-9.]*[a-zA-Z]`)
	var b strings.Builder
	b.WriteString("^")
	last := 0
	for _, loc := range verb.FindAllStringIndex(format, -1) {
		b.WriteString(regexp.QuoteMeta(format[last:loc[0]]))
		b.WriteString(".+")
		last = loc[1]
	}
	b.WriteString(regexp.QuoteMeta(format[last:]))
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}

// ---------------------------------------------------------------- annotations, labels, conditions

// keyPattern is a prefixed Kubernetes key (annotation, label, taint,
// condition type): "lb.labcloud.io/ip".
var keyPattern = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)+[a-z]{2,}/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

// labcloudKey finds labcloud's keys in prose (not the metadata namespace URL).
var labcloudKey = regexp.MustCompile(`(?:^|[^/:\w.-])((?:[a-z0-9-]+\.)+labcloud\.io/[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)`)

func TestKeysDocumented(t *testing.T) {
	code := map[string]string{} // key → where
	for _, dir := range []string{"lb", "provider"} {
		p := parsePkg(t, dir)
		for _, v := range p.consts {
			if keyPattern.MatchString(v) {
				code[v] = dir
			}
		}
		for _, lit := range p.stringLiterals() {
			if keyPattern.MatchString(lit) {
				code[lit] = dir
			}
		}
		// The Service spec fields lb reads besides its annotations.
		for name, v := range p.consts {
			if strings.HasPrefix(name, "Field") {
				code[v] = dir
			}
		}
	}
	if len(code) == 0 {
		t.Fatal("found no annotation, label or condition key in lb/ and provider/")
	}
	ref := readDoc(t, reference)
	refSpans := spanSet(ref)
	for k, dir := range code {
		if !refSpans[k] {
			t.Errorf("%s does not name %s (used in %s/)", reference, k, dir)
		}
	}
	for _, f := range docFiles {
		for _, m := range labcloudKey.FindAllStringSubmatch(readDoc(t, f), -1) {
			if _, ok := code[m[1]]; !ok {
				t.Errorf("%s names %s, which lb/ and provider/ do not define", f, m[1])
			}
		}
	}
	if !strings.Contains(ref, libvirtcloud.MetadataNamespace) {
		t.Errorf("%s does not give the domain metadata namespace %s", reference, libvirtcloud.MetadataNamespace)
	}
}

// TestConditionDocumented: the Service condition's type, reasons and the
// three forms of its message, as lb renders them, are in reference.md's
// Service status section.
func TestConditionDocumented(t *testing.T) {
	sec := section(t, readDoc(t, reference), "Service status")
	have := spanSet(sec)
	p := parsePkg(t, "lb")
	for name, v := range p.consts {
		if strings.HasPrefix(name, "Condition") || strings.HasPrefix(name, "Reason") {
			if !have[v] {
				t.Errorf("%s: Service status does not name %q (lb.%s)", reference, v, name)
			}
		}
	}
	vip := netip.MustParseAddr("10.123.0.200")
	mac, _ := net.ParseMAC("52:54:00:7c:00:01")
	for _, a := range []lb.Answer{{VIP: vip, Node: "lab-node-1", MAC: mac}, {VIP: vip, MAC: mac}, {VIP: vip}} {
		msg := lb.AnnouncedCondition([]lb.Answer{a}).Message
		if !have[msg] {
			t.Errorf("%s: Service status does not show the condition message `%s`", reference, msg)
		}
	}
}

// ---------------------------------------------------------------- cloud config

func TestCloudConfigDocumented(t *testing.T) {
	var fields []cfgField
	configFields(reflect.TypeFor[provider.Config](), "", &fields)
	known := map[string]cfgField{}
	for _, f := range fields {
		known[f.path] = f
	}

	// What a config that turns routes and load balancers on ends up with
	// (defaults filled in by LoadConfig), and the defaults netroutes
	// applies to the zero values it is handed.
	completed, err := provider.LoadConfig(strings.NewReader(`
routes: {bridge: br0}
loadBalancer: {bridge: br0, pools: [{name: p, addresses: [192.0.2.1]}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	// What that document sets itself is not a default.
	setByTest := []string{"routes.bridge", "loadBalancer.bridge", "loadBalancer.pools"}
	// Defaults taken from this machine or from other fields: their rows
	// say so in words.
	fromElsewhere := map[string]bool{"host": true, "hypervisors[].host": true, "hypervisors[].bridge": true}
	defaults := reflect.ValueOf(provider.DefaultConfig())
	derived := map[string]any{
		"routes.protocol": int(netroutes.DefaultProtocol),
		"routes.metric":   netroutes.DefaultMetric,
	}

	ref := readDoc(t, reference)
	sec := section(t, ref, "Cloud config")
	rows := map[string][]string{}
	for _, tb := range tables(sec) {
		if len(tb.header) < 3 || tb.header[0] != "field" || tb.header[1] != "default" {
			continue
		}
		for _, row := range tb.rows {
			path := firstSpan(row[0])
			if _, ok := known[path]; !ok {
				t.Errorf("%s documents cloud-config field %q, which provider.Config does not have", reference, path)
				continue
			}
			rows[path] = row
		}
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no cloud-config table (field | default | ...)", reference)
	}
	for _, f := range fields {
		row, ok := rows[f.path]
		if !ok {
			if !f.group {
				t.Errorf("%s: cloud-config field %s has no row", reference, f.path)
			}
			continue
		}
		if fromElsewhere[f.path] {
			if strings.TrimSpace(row[1]) == "" {
				t.Errorf("%s: %s's row does not say where its default comes from", reference, f.path)
			}
			continue
		}
		// The default: DefaultConfig's; else what LoadConfig derives; else
		// what netroutes makes of a zero.
		want, ok := valueAt(defaults, f.path)
		if !ok || isEmpty(want) {
			if !slices.ContainsFunc(setByTest, func(p string) bool { return f.path == p || strings.HasPrefix(f.path, p+"[]") }) {
				if v, found := valueAt(reflect.ValueOf(completed), f.path); found {
					want, ok = v, true
				}
			}
		}
		if !ok {
			continue // an element of an empty list
		}
		if isEmpty(want) {
			if d, ok := derived[f.path]; ok {
				want = reflect.ValueOf(d)
			}
		}
		tok, has := firstSpanOK(row[1])
		if !has {
			if !isEmpty(want) && !strings.Contains(f.path, "[]") {
				t.Errorf("%s: %s defaults to %v but its row gives no default", reference, f.path, show(want))
			}
			continue
		}
		got := reflect.New(f.typ)
		if err := yaml.Unmarshal([]byte(tok), got.Interface()); err != nil {
			t.Errorf("%s: default `%s` of %s is not a %s: %v", reference, tok, f.path, f.typ, err)
			continue
		}
		if !sameValue(got.Elem(), want) {
			t.Errorf("%s: %s is documented to default to `%s`, the code's default is %s", reference, f.path, tok, show(want))
		}
	}

	// Every document: a dotted cloud-config path is a field.
	top := map[string]bool{}
	for _, f := range fields {
		top[strings.FieldsFunc(f.path, func(r rune) bool { return r == '.' || r == '[' })[0]] = true
	}
	pathRe := regexp.MustCompile(`^([A-Za-z]+)((?:\.[A-Za-z0-9]+|\[[0-9]*\])+)`)
	index := regexp.MustCompile(`\[[0-9]*\]`)
	for _, file := range docFiles {
		for _, s := range spans(readDoc(t, file)) {
			m := pathRe.FindStringSubmatch(s)
			if m == nil || !top[m[1]] {
				continue
			}
			p := index.ReplaceAllString(m[0], "[]")
			if _, ok := known[p]; !ok {
				t.Errorf("%s names cloud-config field `%s`, which provider.Config does not have", file, m[0])
			}
		}
	}
}

type cfgField struct {
	path  string
	typ   reflect.Type
	group bool // a struct whose fields have rows of their own
}

var jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

// plainStruct: a struct that YAML fills field by field (not metav1.Duration).
func plainStruct(t reflect.Type) bool {
	p := reflect.PointerTo(t)
	return t.Kind() == reflect.Struct && !p.Implements(jsonUnmarshaler) && !p.Implements(textUnmarshaler)
}

// configFields lists the json paths of t's fields: "routes.bridge",
// "loadBalancer.pools", "loadBalancer.pools[].name".
func configFields(t reflect.Type, prefix string, out *[]cfgField) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == "-" || tag == "" {
			if f.Anonymous && plainStruct(f.Type) {
				configFields(f.Type, prefix, out)
			}
			continue
		}
		path := tag
		if prefix != "" {
			path = prefix + "." + tag
		}
		switch ft := f.Type; {
		case plainStruct(ft):
			*out = append(*out, cfgField{path: path, typ: ft, group: true})
			configFields(ft, path, out)
		case ft.Kind() == reflect.Slice && plainStruct(ft.Elem()):
			*out = append(*out, cfgField{path: path, typ: ft})
			configFields(ft.Elem(), path+"[]", out)
		default:
			*out = append(*out, cfgField{path: path, typ: ft})
		}
	}
}

// valueAt follows a path of configFields in v; "x[]" is x's first element.
func valueAt(v reflect.Value, path string) (reflect.Value, bool) {
	for seg := range strings.SplitSeq(path, ".") {
		name, list := strings.CutSuffix(seg, "[]")
		found := false
		for i := range v.NumField() {
			tag, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
			if tag == name {
				v, found = v.Field(i), true
				break
			}
		}
		if !found {
			return reflect.Value{}, false
		}
		if list {
			if v.Len() == 0 {
				return reflect.Value{}, false
			}
			v = v.Index(0)
		}
	}
	return v, true
}

func isEmpty(v reflect.Value) bool {
	if v.Kind() == reflect.Slice || v.Kind() == reflect.Map {
		return v.Len() == 0
	}
	return v.IsZero()
}

func sameValue(a, b reflect.Value) bool {
	if isEmpty(a) && isEmpty(b) {
		return true
	}
	if a.CanConvert(b.Type()) && a.Kind() != reflect.Slice {
		a = a.Convert(b.Type())
	}
	return reflect.DeepEqual(a.Interface(), b.Interface())
}

func show(v reflect.Value) string {
	b, err := yaml.Marshal(v.Interface())
	if err != nil {
		return fmt.Sprint(v.Interface())
	}
	return strings.TrimSpace(string(b))
}

// ---------------------------------------------------------------- flag defaults

// TestFlagDefaults: the flags whose defaults setDefaults (in the CCM's main
// package) changes are in reference.md's table with upstream's default and
// labcloud's. setDefaults cannot be called from here, so its assignments are
// read from the source and applied by reflection to upstream's options.
func TestFlagDefaults(t *testing.T) {
	upstreamOpts, err := options.NewCloudControllerManagerOptions()
	if err != nil {
		t.Fatal(err)
	}
	ours, err := options.NewCloudControllerManagerOptions()
	if err != nil {
		t.Fatal(err)
	}
	others := applySetDefaults(t, ours)
	upstream, labcloud := flagDefaults(upstreamOpts), flagDefaults(ours)

	sec := section(t, readDoc(t, reference), "Flag defaults")
	documented := map[string]bool{}
	var retryRow []string
	for _, tb := range tables(sec) {
		if len(tb.header) < 3 || tb.header[0] != "flag" {
			continue
		}
		for _, row := range tb.rows {
			flag, ok := strings.CutPrefix(firstSpan(row[0]), "--")
			if !ok {
				if strings.Contains(row[0], "retry") {
					retryRow = row
				}
				continue
			}
			documented[flag] = true
			up, ok := upstream[flag]
			if !ok {
				t.Errorf("%s documents the default of --%s, which is no flag of the CCM", reference, flag)
				continue
			}
			if doc := cellValue(row[1]); !sameFlagValue(doc, up) {
				t.Errorf("%s: upstream's default of --%s is documented as %q, it is %q", reference, flag, doc, up)
			}
			if doc := cellValue(row[2]); !sameFlagValue(doc, labcloud[flag]) {
				t.Errorf("%s: labcloud's default of --%s is documented as %q, setDefaults makes it %q", reference, flag, doc, labcloud[flag])
			}
		}
	}
	for flag, v := range labcloud {
		if v != upstream[flag] && !documented[flag] {
			t.Errorf("%s: setDefaults changes --%s from %q to %q; the Flag defaults table does not say so", reference, flag, upstream[flag], v)
		}
	}
	if len(documented) == 0 {
		t.Fatalf("%s: no flag rows under Flag defaults", reference)
	}

	// Upstream defaults the section quotes as --flag=value.
	if i := strings.Index(sec, "Upstream defaults"); i >= 0 {
		for _, s := range spans(sec[i:]) {
			flag, value, ok := strings.Cut(strings.TrimPrefix(s, "--"), "=")
			if !ok || !strings.HasPrefix(s, "--") {
				continue
			}
			if v, known := labcloud[flag]; !known {
				t.Errorf("%s quotes `%s`: no such flag", reference, s)
			} else if !sameFlagValue(value, v) || v != upstream[flag] {
				t.Errorf("%s quotes `%s` as an upstream default; upstream's is %q, labcloud's %q", reference, s, upstream[flag], v)
			}
		}
	}

	// The node controller's retry, which has no flag.
	for name, fields := range others {
		if name != "UpdateNodeSpecBackoff" {
			t.Errorf("setDefaults sets %s; teach this test how reference.md documents it", name)
			continue
		}
		if retryRow == nil {
			t.Errorf("%s: setDefaults changes the cloud-node update retry; the Flag defaults table has no row for it", reference)
			continue
		}
		up := nodecontroller.UpdateNodeSpecBackoff
		checkRetry(t, "upstream", retryRow[1], float64(up.Steps), float64(up.Duration), up.Jitter)
		checkRetry(t, "labcloud", retryRow[2], fields["Steps"], fields["Duration"], fields["Jitter"])
	}
}

// checkRetry compares "N tries, A-B ms apart" with a wait.Backoff.
func checkRetry(t *testing.T, whose, cell string, steps, duration, jitter float64) {
	t.Helper()
	m := regexp.MustCompile(`(\d+) tries, ([\d.]+)-([\d.]+) ms apart`).FindStringSubmatch(cell)
	if m == nil {
		t.Errorf("%s: %s cloud-node retry %q does not read `N tries, A-B ms apart`", reference, whose, cell)
		return
	}
	first := duration / float64(time.Millisecond)
	want := fmt.Sprintf("%g tries, %g-%g ms apart", steps, first, first*(1+jitter))
	if got := fmt.Sprintf("%s tries, %s-%s ms apart", m[1], m[2], m[3]); got != want {
		t.Errorf("%s: %s cloud-node retry is documented as %q, the code's is %q", reference, whose, got, want)
	}
}

// applySetDefaults applies setDefaults' assignments to o's fields and
// returns the assignments to other variables, each as its fields' values.
func applySetDefaults(t *testing.T, o *options.CloudControllerManagerOptions) map[string]map[string]float64 {
	t.Helper()
	path := filepath.Join("..", "cmd", "libvirt-cloud-controller-manager", "main.go")
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	prov := parsePkg(t, "provider")
	var fd *ast.FuncDecl
	for _, d := range f.Decls {
		if d, ok := d.(*ast.FuncDecl); ok && d.Name.Name == "setDefaults" {
			fd = d
		}
	}
	if fd == nil || len(fd.Type.Params.List) != 1 || len(fd.Type.Params.List[0].Names) != 1 {
		t.Fatalf("%s: no func setDefaults(o *options.CloudControllerManagerOptions)", path)
	}
	param := fd.Type.Params.List[0].Names[0].Name
	others := map[string]map[string]float64{}
	n := 0
	for _, st := range fd.Body.List {
		as, ok := st.(*ast.AssignStmt)
		if !ok {
			t.Errorf("%s: setDefaults has a statement this test cannot read (%T)", path, st)
			continue
		}
		if as.Tok != token.ASSIGN || len(as.Lhs) != 1 || len(as.Rhs) != 1 {
			t.Errorf("%s: setDefaults has an assignment this test cannot read", path)
			continue
		}
		chain := selectorChain(as.Lhs[0])
		if len(chain) < 2 {
			t.Errorf("%s: setDefaults assigns %s, which this test cannot read", path, exprName(as.Lhs[0]))
			continue
		}
		if chain[0] != param {
			lit, ok := as.Rhs[0].(*ast.CompositeLit)
			if !ok {
				t.Errorf("%s: setDefaults assigns %s a value this test cannot read", path, strings.Join(chain, "."))
				continue
			}
			fields := map[string]float64{}
			for k, e := range compositeFields(lit) {
				v, ok := evalNumber(e)
				if !ok {
					t.Errorf("%s: setDefaults: cannot read %s.%s", path, strings.Join(chain, "."), k)
				}
				fields[k] = v
			}
			others[chain[len(chain)-1]] = fields
			continue
		}
		v := reflect.ValueOf(o)
		for _, name := range chain[1:] {
			for v.Kind() == reflect.Pointer {
				v = v.Elem()
			}
			v = v.FieldByName(name)
			if !v.IsValid() {
				t.Fatalf("%s: setDefaults sets %s, which options.CloudControllerManagerOptions lacks", path, strings.Join(chain, "."))
			}
		}
		switch v.Kind() {
		case reflect.String:
			s, ok := prov.evalString(as.Rhs[0])
			if !ok {
				t.Fatalf("%s: setDefaults: cannot read the value of %s", path, strings.Join(chain, "."))
			}
			v.SetString(s)
		case reflect.Int, reflect.Int32, reflect.Int64, reflect.Float32, reflect.Float64:
			x, ok := evalNumber(as.Rhs[0])
			if !ok {
				t.Fatalf("%s: setDefaults: cannot read the value of %s", path, strings.Join(chain, "."))
			}
			if v.CanFloat() {
				v.SetFloat(x)
			} else {
				v.SetInt(int64(x))
			}
		default:
			t.Fatalf("%s: setDefaults sets %s of kind %s, which this test cannot set", path, strings.Join(chain, "."), v.Kind())
		}
		n++
	}
	if n == 0 {
		t.Fatalf("%s: found no option set by setDefaults", path)
	}
	return others
}

// flagDefaults is every flag of the CCM with its default, as upstream's
// flag sets print it for o.
func flagDefaults(o *options.CloudControllerManagerOptions) map[string]string {
	out := map[string]string{}
	name := regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`)
	for _, fs := range o.Flags(nil, nil, nil, nil, nil).FlagSets {
		for _, m := range name.FindAllStringSubmatch(fs.FlagUsages(), -1) {
			if f := fs.Lookup(m[1]); f != nil {
				out[f.Name] = f.DefValue
			}
		}
	}
	return out
}

// cellValue is a table cell's value: its first code span, else its first word.
func cellValue(cell string) string {
	v, ok := firstSpanOK(cell)
	if !ok {
		if w := strings.Fields(cell); len(w) > 0 {
			v = w[0]
		}
	}
	if v == `""` {
		v = ""
	}
	return v
}

func sameFlagValue(a, b string) bool {
	if a == b {
		return true
	}
	if x, err := time.ParseDuration(a); err == nil {
		y, err := time.ParseDuration(b)
		return err == nil && x == y
	}
	if x, err := strconv.ParseFloat(a, 64); err == nil {
		y, err := strconv.ParseFloat(b, 64)
		return err == nil && x == y
	}
	return false
}

// evalNumber evaluates the constant expressions setDefaults uses: numbers,
// products and time units.
func evalNumber(e ast.Expr) (float64, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		x, err := strconv.ParseFloat(e.Value, 64)
		return x, err == nil
	case *ast.ParenExpr:
		return evalNumber(e.X)
	case *ast.BinaryExpr:
		x, ok1 := evalNumber(e.X)
		y, ok2 := evalNumber(e.Y)
		switch {
		case !ok1 || !ok2:
		case e.Op == token.MUL:
			return x * y, true
		case e.Op == token.ADD:
			return x + y, true
		}
	case *ast.SelectorExpr:
		if exprName(e.X) == "time" {
			units := map[string]time.Duration{"Nanosecond": time.Nanosecond, "Microsecond": time.Microsecond,
				"Millisecond": time.Millisecond, "Second": time.Second, "Minute": time.Minute, "Hour": time.Hour}
			if u, ok := units[e.Sel.Name]; ok {
				return float64(u), true
			}
		}
	}
	return 0, false
}

// ---------------------------------------------------------------- links and wording

// mdLink is an inline Markdown link or image: [text](target).
var mdLink = regexp.MustCompile(`!?\[[^\]\n]*\]\(([^)\s]+)\)`)

// TestLinksResolve: every relative link of every document points at a file
// or directory that exists, and a #fragment at a heading of the Markdown
// file it names (as GitHub makes heading anchors).
func TestLinksResolve(t *testing.T) {
	anchors := map[string]map[string]bool{} // document (from the repository root) → its anchors
	anchorsOf := func(rel string) map[string]bool {
		if a, ok := anchors[rel]; ok {
			return a
		}
		a := headingAnchors(readDoc(t, rel))
		anchors[rel] = a
		return a
	}
	for _, f := range docFiles {
		all, prose := lines(readDoc(t, f))
		for i, l := range all {
			if !prose[i] {
				continue
			}
			l = codeSpan.ReplaceAllString(l, "")
			for _, m := range mdLink.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, frag, _ := strings.Cut(target, "#")
				rel := f
				if path != "" {
					rel = filepath.ToSlash(filepath.Join(filepath.Dir(f), path))
					if strings.HasPrefix(rel, "../") {
						t.Errorf("%s:%d: link %s leaves the repository", f, i+1, target)
						continue
					}
					if _, err := os.Stat(filepath.Join("..", rel)); err != nil {
						t.Errorf("%s:%d: link %s: no such file or directory %s", f, i+1, target, rel)
						continue
					}
				}
				if frag == "" {
					continue
				}
				if !strings.HasSuffix(rel, ".md") {
					t.Errorf("%s:%d: link %s: a fragment of %s, which is not Markdown", f, i+1, target, rel)
					continue
				}
				if !anchorsOf(rel)[frag] {
					t.Errorf("%s:%d: link %s: %s has no heading with the anchor #%s", f, i+1, target, rel, frag)
				}
			}
		}
	}
}

// headingAnchors are the anchors GitHub gives the headings of md: the
// heading's text, lower case, without punctuation but for '-' and '_',
// spaces turned into '-'; a repeated anchor gets -1, -2, ...
func headingAnchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	all, prose := lines(md)
	for i, l := range all {
		if !prose[i] {
			continue
		}
		n, text := headingLevel(l)
		if n == 0 {
			continue
		}
		text = strings.TrimSpace(strings.TrimRight(text, "#"))
		text = mdLink.ReplaceAllStringFunc(text, func(s string) string {
			return s[strings.Index(s, "[")+1 : strings.Index(s, "](")]
		})
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if k := seen[a]; k > 0 {
			out[fmt.Sprintf("%s-%d", a, k)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// TestDocsSayWhatIsTrue: the documents describe the code as it is; the
// history of a figure or a behaviour belongs in the commit that changed it.
// Words that only a diary uses are refused.
func TestDocsSayWhatIsTrue(t *testing.T) {
	diary := regexp.MustCompile(`(?i)\bwithdrawn\b|contrary to what|said before`)
	for _, f := range docFiles {
		for i, l := range strings.Split(readDoc(t, f), "\n") {
			if m := diary.FindString(l); m != "" {
				t.Errorf("%s:%d says %q: say what is true now", f, i+1, m)
			}
		}
	}
}

// ---------------------------------------------------------------- Go source

type pkg struct {
	dir    string
	files  []*ast.File
	consts map[string]string // string constants by name
}

// parsePkg parses the non-test Go files of dir (relative to the repository root).
func parsePkg(t *testing.T, dir string) *pkg {
	t.Helper()
	names, err := filepath.Glob(filepath.Join("..", dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	p := &pkg{dir: dir, consts: map[string]string{}}
	fset := token.NewFileSet()
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		p.files = append(p.files, f)
	}
	if len(p.files) == 0 {
		t.Fatalf("no Go files in %s", dir)
	}
	for changed := true; changed; {
		changed = false
		p.values(token.CONST, func(name string, v ast.Expr) {
			if _, done := p.consts[name]; done {
				return
			}
			if s, ok := p.evalString(v); ok {
				p.consts[name] = s
				changed = true
			}
		})
	}
	return p
}

// values calls fn with the name and value of every var or const (tok) of
// the package that has a value.
func (p *pkg) values(tok token.Token, fn func(name string, v ast.Expr)) {
	for _, f := range p.files {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != tok {
				continue
			}
			for _, s := range gd.Specs {
				vs := s.(*ast.ValueSpec)
				for i, v := range vs.Values {
					fn(vs.Names[i].Name, v)
				}
			}
		}
	}
}

// evalString evaluates a string constant expression of the package
// (provider's for a "provider." selector).
func (p *pkg) evalString(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.Ident:
		s, ok := p.consts[e.Name]
		return s, ok
	case *ast.ParenExpr:
		return p.evalString(e.X)
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		x, ok1 := p.evalString(e.X)
		y, ok2 := p.evalString(e.Y)
		return x + y, ok1 && ok2
	case *ast.SelectorExpr:
		if exprName(e.X) == "provider" && p.dir == "provider" {
			s, ok := p.consts[e.Sel.Name]
			return s, ok
		}
	}
	return "", false
}

// exportedStrings are the package's exported string constants.
func (p *pkg) exportedStrings() map[string]string {
	out := map[string]string{}
	for name, v := range p.consts {
		if ast.IsExported(name) {
			out[name] = v
		}
	}
	return out
}

// stringLiterals are the string literals outside import declarations.
func (p *pkg) stringLiterals() []string {
	var out []string
	for _, f := range p.files {
		for _, d := range f.Decls {
			if gd, ok := d.(*ast.GenDecl); ok && gd.Tok == token.IMPORT {
				continue
			}
			ast.Inspect(d, func(n ast.Node) bool {
				if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if s, err := strconv.Unquote(lit.Value); err == nil {
						out = append(out, s)
					}
				}
				return true
			})
		}
	}
	return out
}

func (p *pkg) funcs() []*ast.FuncDecl {
	var out []*ast.FuncDecl
	for _, f := range p.files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				out = append(out, fd)
			}
		}
	}
	return out
}

// compositeFields are the keyed fields of a (possibly &) composite literal.
func compositeFields(e ast.Expr) map[string]ast.Expr {
	if u, ok := e.(*ast.UnaryExpr); ok && u.Op == token.AND {
		e = u.X
	}
	lit, ok := e.(*ast.CompositeLit)
	if !ok {
		return nil
	}
	out := map[string]ast.Expr{}
	for _, el := range lit.Elts {
		if kv, ok := el.(*ast.KeyValueExpr); ok {
			out[exprName(kv.Key)] = kv.Value
		}
	}
	return out
}

func selectorChain(e ast.Expr) []string {
	switch e := e.(type) {
	case *ast.Ident:
		return []string{e.Name}
	case *ast.SelectorExpr:
		if c := selectorChain(e.X); c != nil {
			return append(c, e.Sel.Name)
		}
	}
	return nil
}

func exprName(e ast.Expr) string { return strings.Join(selectorChain(e), ".") }

// ---------------------------------------------------------------- Markdown

func readDoc(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// lines splits md into lines, each with whether it is prose (outside a
// fenced code block).
func lines(md string) (all []string, prose []bool) {
	fence := false
	for l := range strings.SplitSeq(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fence = !fence
			all, prose = append(all, l), append(prose, false)
			continue
		}
		all, prose = append(all, l), append(prose, !fence)
	}
	return all, prose
}

func headingLevel(l string) (int, string) {
	n := len(l) - len(strings.TrimLeft(l, "#"))
	if n == 0 || n > 6 || !strings.HasPrefix(l[n:], " ") {
		return 0, ""
	}
	return n, strings.TrimSpace(l[n:])
}

// section is the text under the heading titled title, up to the next
// heading of the same or a higher level (headings in code blocks do not count).
func section(t *testing.T, md, title string) string {
	t.Helper()
	all, prose := lines(md)
	start, level := -1, 0
	for i, l := range all {
		if !prose[i] {
			continue
		}
		n, text := headingLevel(l)
		if n == 0 {
			continue
		}
		if start < 0 {
			if text == title {
				start, level = i+1, n
			}
			continue
		}
		if n <= level {
			return strings.Join(all[start:i], "\n")
		}
	}
	if start < 0 {
		t.Fatalf("no section %q", title)
	}
	return strings.Join(all[start:], "\n")
}

type table struct {
	header []string
	rows   [][]string
}

var separatorRow = regexp.MustCompile(`^\|(\s*:?-+:?\s*\|)+\s*$`)

// tables are the Markdown tables of md, outside code blocks.
func tables(md string) []table {
	all, prose := lines(md)
	var out []table
	for i := 0; i+1 < len(all); i++ {
		if !prose[i] || !strings.HasPrefix(all[i], "|") || !separatorRow.MatchString(strings.TrimSpace(all[i+1])) {
			continue
		}
		tb := table{header: cells(all[i])}
		i += 2
		for ; i < len(all) && prose[i] && strings.HasPrefix(all[i], "|"); i++ {
			tb.rows = append(tb.rows, cells(all[i]))
		}
		out = append(out, tb)
	}
	return out
}

// cells splits a table row on the pipes that are not escaped.
func cells(row string) []string {
	row = strings.TrimSpace(row)
	row = strings.TrimPrefix(row, "|")
	row = strings.TrimSuffix(row, "|")
	var out []string
	var cur strings.Builder
	for i := 0; i < len(row); i++ {
		switch {
		case row[i] == '\\' && i+1 < len(row) && row[i+1] == '|':
			cur.WriteByte('|')
			i++
		case row[i] == '|':
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteByte(row[i])
		}
	}
	return append(out, strings.TrimSpace(cur.String()))
}

var codeSpan = regexp.MustCompile("`([^`\n]+)`")

// spans are the code spans of md (outside code blocks).
func spans(md string) []string {
	all, prose := lines(md)
	var out []string
	for i, l := range all {
		if !prose[i] {
			continue
		}
		for _, m := range codeSpan.FindAllStringSubmatch(l, -1) {
			out = append(out, m[1])
		}
	}
	return out
}

func spanSet(md string) map[string]bool {
	out := map[string]bool{}
	for _, s := range spans(md) {
		out[s] = true
	}
	return out
}

func firstSpanOK(s string) (string, bool) {
	if m := codeSpan.FindStringSubmatch(s); m != nil {
		return m[1], true
	}
	return "", false
}

func firstSpan(s string) string {
	v, _ := firstSpanOK(s)
	return v
}
