package docs

// Relative links and #fragments of every document, against the files
// and headings they point at.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode"
)

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
	_, hs := headings(md)
	for _, h := range hs {
		text := strings.TrimSpace(strings.TrimRight(h.text, "#"))
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
