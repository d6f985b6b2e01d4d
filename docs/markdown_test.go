package docs

// Reading the documents: their lines, sections, tables and code spans.

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

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

// mdHeading is a heading of a document: its line's index, level and text.
type mdHeading struct {
	line, level int
	text        string
}

// headings splits md into lines and finds its headings (those in fenced
// code blocks do not count).
func headings(md string) (all []string, hs []mdHeading) {
	all, prose := lines(md)
	for i, l := range all {
		n := len(l) - len(strings.TrimLeft(l, "#"))
		if prose[i] && n > 0 && n <= 6 && strings.HasPrefix(l[n:], " ") {
			hs = append(hs, mdHeading{line: i, level: n, text: strings.TrimSpace(l[n:])})
		}
	}
	return all, hs
}

// section is the text under the first heading titled title, up to the next
// heading of the same or a higher level.
func section(t *testing.T, md, title string) string {
	t.Helper()
	all, hs := headings(md)
	for i, h := range hs {
		if h.text != title {
			continue
		}
		end := len(all)
		for _, next := range hs[i+1:] {
			if next.level <= h.level {
				end = next.line
				break
			}
		}
		return strings.Join(all[h.line+1:end], "\n")
	}
	t.Fatalf("no section %q", title)
	return ""
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

// mdLink is an inline Markdown link or image: [text](target).
var mdLink = regexp.MustCompile(`!?\[[^\]\n]*\]\(([^)\s]+)\)`)

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
