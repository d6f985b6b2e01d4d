package docs

// The Flag defaults table of reference.md, against upstream's flag set
// and the CCM's setDefaults.

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	nodecontroller "k8s.io/cloud-provider/controllers/node"
	"k8s.io/cloud-provider/options"
)

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
