// Package docs holds the test that keeps the documents in step with the
// code: docs/reference.md must name every metric, event reason, annotation,
// label, condition, cloud-config field and flag default the code has, and
// no document (README.md, CONTRIBUTING.md, docs/*.md) may name one the code
// does not have, nor link to a file or heading that does not exist. Names
// are read from the code (go/ast over the sources, reflection over
// provider.Config, upstream's flag set), never from a list kept here.
package docs

import (
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
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
