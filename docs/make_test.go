package docs

// The make targets the documents name, against the Makefile.

import (
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var makeRule = regexp.MustCompile(`(?m)^([A-Za-z0-9_.-]+(?:[ \t]+[A-Za-z0-9_.-]+)*)[ \t]*:(?:[^=]|$)`)

func makeTargets(t *testing.T) map[string]bool {
	out := map[string]bool{}
	for _, m := range makeRule.FindAllStringSubmatch(readDoc(t, "Makefile"), -1) {
		for _, target := range strings.Fields(m[1]) {
			if !strings.HasPrefix(target, ".") {
				out[target] = true
			}
		}
	}
	return out
}

// TestMakeTargetsExist: every `make TARGET` a document shows is a rule of
// the Makefile.
func TestMakeTargetsExist(t *testing.T) {
	targets := makeTargets(t)
	checked := 0
	for s, cmds := range commandsOf(snippets(t), "make") {
		for _, args := range cmds {
			for i := 0; i < len(args); i++ {
				switch a := args[i]; {
				case a == "-C" || a == "-f" || a == "-j":
					i++
				case strings.HasPrefix(a, "-") || assignment.MatchString(a):
				default:
					checked++
					if !targets[a] {
						t.Errorf("%s: `make %s`: the Makefile has no target %s", s, strings.Join(args, " "), a)
					}
				}
			}
		}
	}
	if checked < 20 {
		t.Errorf("only %d make targets found in the documents: is the extraction broken?", checked)
	}
}

// recipes are the Makefile's recipe lines by target.
func recipes(t *testing.T) map[string][]string {
	out := map[string][]string{}
	var current []string
	for l := range strings.SplitSeq(readDoc(t, "Makefile"), "\n") {
		if strings.HasPrefix(l, "\t") {
			for _, target := range current {
				out[target] = append(out[target], l)
			}
			continue
		}
		current = nil
		if m := makeRule.FindStringSubmatch(l); m != nil {
			current = strings.Fields(m[1])
		}
	}
	return out
}

var goTestPackage = regexp.MustCompile(`^\./([a-z0-9_/-]+?)/(?:\.\.\.)?$`)

// TestMakeTargetsTable: CONTRIBUTING.md's table of make targets has a row
// for every target (but `all`, which is `build`), and a row that names Go
// packages names those the target's recipe tests.
func TestMakeTargetsTable(t *testing.T) {
	tbs := tables(section(t, readDoc(t, "CONTRIBUTING.md"), "Make targets"))
	if len(tbs) == 0 {
		t.Fatal("CONTRIBUTING.md, Make targets: no table")
	}
	rec := recipes(t)
	rows := map[string]bool{}
	for _, row := range tbs[0].rows {
		var targets []string
		for _, sp := range spans(row[0]) {
			if target, ok := strings.CutPrefix(sp, "make "); ok {
				targets = append(targets, target)
				rows[target] = true
			}
		}
		var named []string
		for _, sp := range spans(strings.Join(row[1:], " ")) {
			if hasGoSource(filepath.Join("..", sp)) {
				named = append(named, sp)
			}
		}
		if len(named) == 0 || len(targets) != 1 {
			continue
		}
		var tested []string
		for _, l := range rec[targets[0]] {
			for _, w := range strings.Fields(l) {
				if m := goTestPackage.FindStringSubmatch(w); m != nil {
					tested = append(tested, m[1])
				}
			}
		}
		slices.Sort(named)
		slices.Sort(tested)
		if !slices.Equal(named, tested) {
			t.Errorf("CONTRIBUTING.md: `make %s` is said to test %v; its recipe tests %v", targets[0], named, tested)
		}
	}
	for target := range makeTargets(t) {
		if target != "all" && !rows[target] {
			t.Errorf("CONTRIBUTING.md, Make targets: `make %s` has no row", target)
		}
	}
}
