package systemdroot

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// fallbackMirror is used when the host's apt sources name no bookworm suite.
const fallbackMirror = "http://deb.debian.org/debian"

// HostSources returns one-line sources.list entries ("deb [opts] URI SUITE
// COMPONENTS") for codename and its -updates/-security suites, taken from the
// host's apt configuration (sources.list, *.list and deb822 *.sources), so that
// mmdebstrap uses the same, reachable, archive as the host.
func HostSources(codename string) ([]string, error) {
	var lines []string
	add := func(path string, parse func(string, string) []string) error {
		b, err := os.ReadFile(path)
		if os.IsNotExist(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read apt sources: %w", err)
		}
		lines = append(lines, parse(string(b), codename)...)
		return nil
	}
	if err := add("/etc/apt/sources.list", parseOneLine); err != nil {
		return nil, err
	}
	for _, glob := range []struct {
		pattern string
		parse   func(string, string) []string
	}{{"*.list", parseOneLine}, {"*.sources", parseDeb822}} {
		files, err := filepath.Glob(filepath.Join("/etc/apt/sources.list.d", glob.pattern))
		if err != nil {
			return nil, fmt.Errorf("list apt sources: %w", err)
		}
		for _, f := range files {
			if err := add(f, glob.parse); err != nil {
				return nil, err
			}
		}
	}
	if len(lines) == 0 {
		lines = []string{fmt.Sprintf("deb %s %s main", fallbackMirror, codename)}
	}
	return dedup(lines), nil
}

// wantSuite accepts the release itself and its -updates, -security, ... suites.
func wantSuite(suite, codename string) bool {
	return suite == codename || strings.HasPrefix(suite, codename+"-")
}

// parseOneLine reads the classic format: deb [opt=v ...] URI SUITE COMPONENT...
func parseOneLine(text, codename string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if i := strings.IndexByte(l, '#'); i >= 0 {
			l = l[:i]
		}
		f := strings.Fields(l)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		opts := ""
		if strings.HasPrefix(f[1], "[") {
			i := 1
			for ; i < len(f) && !strings.HasSuffix(f[i], "]"); i++ {
			}
			if i+2 >= len(f) {
				continue
			}
			opts = strings.Join(f[1:i+1], " ") + " "
			f = append([]string{"deb"}, f[i+1:]...)
		}
		if wantSuite(f[2], codename) {
			out = append(out, "deb "+opts+strings.Join(f[1:], " "))
		}
	}
	return out
}

// parseDeb822 reads *.sources stanzas (Types, URIs, Suites, Components,
// Signed-By, Enabled). An inline Signed-By key is dropped: mmdebstrap then
// falls back to the host's keyrings.
func parseDeb822(text, codename string) []string {
	var out []string
	for _, stanza := range deb822Stanzas(text) {
		if strings.EqualFold(stanza["enabled"], "no") || !slices.Contains(strings.Fields(stanza["types"]), "deb") {
			continue
		}
		opts := ""
		if sb := stanza["signed-by"]; strings.HasPrefix(sb, "/") && !strings.ContainsAny(sb, " \n") {
			opts = "[signed-by=" + sb + "] "
		}
		for _, uri := range strings.Fields(stanza["uris"]) {
			for _, suite := range strings.Fields(stanza["suites"]) {
				if wantSuite(suite, codename) {
					out = append(out, strings.TrimSpace("deb "+opts+uri+" "+suite+" "+stanza["components"]))
				}
			}
		}
	}
	return out
}

// deb822Stanzas splits text into paragraphs of lower-cased field names to
// values; continuation lines are appended with a newline.
func deb822Stanzas(text string) []map[string]string {
	var stanzas []map[string]string
	cur, key := map[string]string{}, ""
	flush := func() {
		if len(cur) > 0 {
			stanzas = append(stanzas, cur)
		}
		cur, key = map[string]string{}, ""
	}
	for _, l := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(l, "#"):
		case strings.TrimSpace(l) == "":
			flush()
		case l[0] == ' ' || l[0] == '\t':
			if key != "" {
				cur[key] += "\n" + strings.TrimSpace(l)
			}
		default:
			k, v, ok := strings.Cut(l, ":")
			if !ok {
				continue
			}
			key = strings.ToLower(strings.TrimSpace(k))
			cur[key] = strings.TrimSpace(v)
		}
	}
	flush()
	return stanzas
}

func dedup(list []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range list {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
