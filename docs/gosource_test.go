package docs

// Reading the Go source the other tests check the documents against:
// a package's files, its constants (a small constant evaluator) and the
// literals, functions and selectors they hold.

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

type pkg struct {
	dir    string
	files  []*ast.File
	consts map[string]string // string constants by name
}

// parsePkg parses the non-test Go files of dir (relative to the repository
// root), and of the more dirs read as part of it (a sub-package).
func parsePkg(t *testing.T, dir string, more ...string) *pkg {
	t.Helper()
	var names []string
	for _, d := range append([]string{dir}, more...) {
		n, err := filepath.Glob(filepath.Join("..", d, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, n...)
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
