package docs

// The Metrics table of reference.md and every labcloud_* name in the
// documents, against what metrics.Register registers.

import (
	"go/ast"
	"go/token"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/labcloud/labcloud/metrics"
)

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
