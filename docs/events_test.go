package docs

// The Event reasons table of reference.md and the events the documents
// quote, against the reasons, types and messages provider/ records.

import (
	"go/ast"
	"go/token"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

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
			r := checkReason(t, code, reference, reason, row[1], "documents", "documented as")
			if r == nil {
				continue
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
			checkReason(t, code, ts, reason, m[1], "has a section for", "headed")
		}
	}
	for reason := range code {
		if !seen[reason] {
			t.Errorf("%s: no section for event reason %s", ts, reason)
		}
	}
}

// checkReason checks an event reason that file names, and the types it
// gives it in types, against provider/'s; names and shows word the errors
// ("documents", "documented as"). It returns nil for a reason provider/
// does not record.
func checkReason(t *testing.T, code map[string]*reasonInfo, file, reason, types, names, shows string) *reasonInfo {
	t.Helper()
	r, ok := code[reason]
	if !ok {
		t.Errorf("%s %s event reason %q, which provider/ does not record", file, names, reason)
		return nil
	}
	if got, want := typesOf(types), r.typeList(); !slices.Equal(got, want) {
		t.Errorf("%s: event %s is %s %v, provider/ records it as %v", file, reason, shows, got, want)
	}
	return r
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

// codeEventReasons finds the event reasons of provider/ (with its
// placement package, which records the VIPs' own): string constants
// named Reason* or Event*, each with the event types it is recorded with.
// A reason is recorded when it follows v1.EventType{Normal,Warning} in a
// call's arguments, directly, through a local variable, or through a
// function that passes its parameter on that way (warnOnce).
func codeEventReasons(t *testing.T) map[string]*reasonInfo {
	t.Helper()
	p := parsePkg(t, "provider", "provider/placement")
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
	// calls calls visit with every call in provider/'s functions, with the
	// function and its locals.
	calls := func(visit func(fd *ast.FuncDecl, loc map[string][]string, call *ast.CallExpr)) {
		for _, fd := range p.funcs() {
			loc := locals(fd)
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				if call, ok := n.(*ast.CallExpr); ok {
					visit(fd, loc, call)
				}
				return true
			})
		}
	}
	calls(func(fd *ast.FuncDecl, loc map[string][]string, call *ast.CallExpr) {
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
	})
	calls(func(fd *ast.FuncDecl, loc map[string][]string, call *ast.CallExpr) {
		if fw, ok := forwarders[calledName(call)]; ok && fw.param < len(call.Args) {
			record(fd, loc, call.Args[fw.param], fw.typ)
		}
	})
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
