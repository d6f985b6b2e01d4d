package docs

// The names the documents give that are not commands: LABCLOUD_*
// variables, against the code and scripts that read them, and `pkg.Name`
// of this module, against its package.

import (
	"go/ast"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// ---------------------------------------------------------------- LABCLOUD_*

var labcloudVar = regexp.MustCompile(`\bLABCLOUD_[A-Z0-9]+(?:_[A-Z0-9]+)*\b`)

// TestEnvVarsExist: every LABCLOUD_* variable a document names is read or
// set somewhere outside the documents (Go, the Makefile, hack/, the Action,
// CI).
func TestEnvVarsExist(t *testing.T) {
	code := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == ".git" || path == filepath.Join("..", "docs") || d.Name() == "bin" || d.Name() == "dist" {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".md") {
			return nil
		}
		info, err := d.Info()
		if err != nil || info.Size() > 1<<20 || !info.Mode().IsRegular() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, v := range labcloudVar.FindAllString(string(b), -1) {
			code[v] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, f := range docFiles {
		for i, l := range strings.Split(readDoc(t, f), "\n") {
			for _, v := range labcloudVar.FindAllString(l, -1) {
				found++
				if !code[v] {
					t.Errorf("%s:%d names %s, which nothing outside the documents reads or sets", f, i+1, v)
				}
			}
		}
	}
	if found == 0 {
		t.Error("no LABCLOUD_* variable found in the documents: is the pattern broken?")
	}
}

// ---------------------------------------------------------------- Go names

var goName = regexp.MustCompile(`^([a-z][a-z0-9]*)\.([A-Z][A-Za-z0-9_]*)(?:\(\))?$`)

// TestGoNamesExist: a code span `pkg.Name` naming a package of this module
// names something that package declares.
func TestGoNamesExist(t *testing.T) {
	decls := moduleDecls(t)
	checked := 0
	for _, s := range snippets(t) {
		m := goName.FindStringSubmatch(s.text)
		if m == nil {
			continue
		}
		names, ours := decls[m[1]]
		if !ours {
			continue // another module's package (cloudprovider, app)
		}
		checked++
		if !names[m[2]] {
			t.Errorf("%s: `%s`: package %s declares no %s", s, s.text, m[1], m[2])
		}
	}
	if checked == 0 {
		t.Error("no `pkg.Name` of this module found in the documents: is the pattern broken?")
	}
}

// moduleDecls are the top-level names each package of the module declares,
// by package name.
func moduleDecls(t *testing.T) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if name := d.Name(); path != ".." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin") {
			return filepath.SkipDir
		}
		if path != ".." && fileExists(filepath.Join(path, "go.mod")) {
			return filepath.SkipDir // a module of its own (hack/tools)
		}
		if !hasGoSource(path) {
			return nil
		}
		rel, err := filepath.Rel("..", path)
		if err != nil {
			return err
		}
		p := parsePkg(t, rel)
		names := out[p.files[0].Name.Name]
		if names == nil {
			names = map[string]bool{}
			out[p.files[0].Name.Name] = names
		}
		for _, f := range p.files {
			for _, d := range f.Decls {
				declNames(d, names)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func hasGoSource(dir string) bool {
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	return slices.ContainsFunc(files, func(f string) bool { return !strings.HasSuffix(f, "_test.go") })
}

// declNames adds the names a top-level declaration declares (not methods).
func declNames(d ast.Decl, names map[string]bool) {
	switch d := d.(type) {
	case *ast.FuncDecl:
		if d.Recv == nil {
			names[d.Name.Name] = true
		}
	case *ast.GenDecl:
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				names[s.Name.Name] = true
			case *ast.ValueSpec:
				for _, n := range s.Names {
					names[n.Name] = true
				}
			}
		}
	}
}
