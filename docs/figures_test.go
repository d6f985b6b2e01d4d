package docs

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// figure is a measured quantity a document gives: numbers with one unit
// ("1.6 s", "97.1-97.6 MiB", "48 / 50 / 106 ms", "37.4, 39.2 s").
var figure = regexp.MustCompile(`(?:[~+]|\b)\d+(?:\.\d+)?(?:(?:-|–|, \+?|,\s+\+?| / | to )\d+(?:\.\d+)?)*\s*((?:ms|µs|ns|s|min|h|MiB|GiB|KiB|MB|GB|kB|passed|failed)\b|%)`)

var number = regexp.MustCompile(`\d+(?:\.\d+)?`)

// measure is a figure as a document writes it, on its line, and its
// numbers each with the unit ("48 ms", "50 ms", "106 ms").
type measure struct {
	line int
	text string
	keys []string
}

func figures(md string) []measure {
	var out []measure
	for _, loc := range figure.FindAllStringSubmatchIndex(md, -1) {
		text := md[loc[0]:loc[1]]
		unit := md[loc[2]:loc[3]]
		var keys []string
		for _, n := range number.FindAllString(text[:loc[2]-loc[0]], -1) {
			keys = append(keys, n+" "+unit)
		}
		out = append(out, measure{1 + strings.Count(md[:loc[0]], "\n"), strings.Join(strings.Fields(text), " "), keys})
	}
	return out
}

// TestReadmeFiguresInPerformance: every figure the README gives (a time,
// a size, a share of a core, a count of tests passed) is one that
// docs/performance.md gives: each of its numbers, in the same unit, in one
// figure there ("37.4-42.2 s" in "37.4, 39.2, 39.6, 42.2 s"). The front
// page cannot drift from the page that says how each was measured.
func TestReadmeFiguresInPerformance(t *testing.T) {
	perf := figures(readDoc(t, "docs/performance.md"))
	found := 0
	for _, f := range figures(readDoc(t, "README.md")) {
		found++
		if !slices.ContainsFunc(perf, func(p measure) bool { return containsAll(p.keys, f.keys) }) {
			t.Errorf("README.md:%d gives %q, which no figure of docs/performance.md gives (%s)", f.line, f.text, strings.Join(f.keys, ", "))
		}
	}
	if found < 15 {
		t.Errorf("only %d figures found in README.md: is the pattern broken?", found)
	}
}

func containsAll(set, want []string) bool {
	for _, w := range want {
		if !slices.Contains(set, w) {
			return false
		}
	}
	return true
}
