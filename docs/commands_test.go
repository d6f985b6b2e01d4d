package docs

// The commands the documents show, checked against what runs them: every
// labcloud and CCM command line against the built binaries' --help
// (make_test.go: make targets; names_test.go: LABCLOUD_* variables and Go
// names).

import (
	"maps"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// snippet is code a document shows: one line of a code block (with the
// lines a trailing backslash continues) or one inline code span.
type snippet struct {
	file string
	line int
	text string
}

func (s snippet) String() string { return s.file + ":" + strconv.Itoa(s.line) }

// multiLineSpan is a code span, which Markdown lets cross the lines of a
// paragraph.
var multiLineSpan = regexp.MustCompile("`([^`]+)`")

// snippets are the code blocks' lines and the code spans of every document.
func snippets(t *testing.T) []snippet {
	var out []snippet
	for _, f := range docFiles {
		all, prose := lines(readDoc(t, f))
		for i := 0; i < len(all); i++ {
			if !prose[i] {
				if isFence(all[i]) {
					continue
				}
				start, text := i, all[i]
				for strings.HasSuffix(text, `\`) && i+1 < len(all) && !prose[i+1] && !isFence(all[i+1]) {
					i++
					text = strings.TrimSuffix(text, `\`) + " " + all[i]
				}
				out = append(out, snippet{f, start + 1, text})
				continue
			}
			start := i
			for i+1 < len(all) && prose[i+1] && strings.TrimSpace(all[i+1]) != "" {
				i++
			}
			para := strings.Join(all[start:i+1], "\n")
			for _, m := range multiLineSpan.FindAllStringSubmatchIndex(para, -1) {
				line := start + 1 + strings.Count(para[:m[0]], "\n")
				out = append(out, snippet{f, line, strings.ReplaceAll(para[m[2]:m[3]], "\n", " ")})
			}
		}
	}
	return out
}

func isFence(l string) bool { return strings.HasPrefix(strings.TrimSpace(l), "```") }

// simpleCommands splits shell text into its simple commands, each a list
// of words with the quotes taken out. Pipes, lists, subshells, command
// substitutions, redirections and comments end a command; what follows a
// comment's # is read as a command too, since documents put commands in
// comments ("brings the lab up (labcloud up --nodes 3)").
func simpleCommands(s string) [][]string {
	var out [][]string
	var cmd []string
	var word strings.Builder
	inWord := false
	endWord := func() {
		if inWord {
			cmd = append(cmd, word.String())
			word.Reset()
			inWord = false
		}
	}
	endCmd := func() {
		endWord()
		if len(cmd) > 0 {
			out = append(out, cmd)
			cmd = nil
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				j = len(s) - i - 1
			}
			word.WriteString(s[i+1 : i+1+j])
			inWord, i = true, i+1+j
		case c == '"':
			j := i + 1
			for ; j < len(s) && s[j] != '"'; j++ {
				if s[j] == '\\' && j+1 < len(s) {
					j++
				}
				word.WriteByte(s[j])
			}
			inWord, i = true, j
		case c == '\\' && i+1 < len(s):
			word.WriteByte(s[i+1])
			inWord, i = true, i+1
		case c == ' ' || c == '\t':
			endWord()
		case strings.IndexByte("|&;()`<>", c) >= 0, c == '#' && !inWord, c == '$' && i+1 < len(s) && s[i+1] == '(':
			endCmd()
		default:
			word.WriteByte(c)
			inWord = true
		}
	}
	endCmd()
	return out
}

var placeholder = regexp.MustCompile(`^[A-Z][A-Z0-9_-]*$`)

var assignment = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// program is the command a simple command runs and its arguments, past
// prompts, sudo, environment assignments and shell keywords. A unit's
// ExecStart= counts as running its value.
func program(words []string) (string, []string) {
	for i, w := range words {
		switch {
		case w == "$" || w == "sudo" || w == "-E" || w == "time" || w == "env" ||
			w == "then" || w == "do" || w == "else" || w == "!":
		case strings.HasPrefix(w, "ExecStart="):
			return filepath.Base(strings.TrimPrefix(w, "ExecStart=")), words[i+1:]
		case assignment.MatchString(w):
		default:
			return filepath.Base(w), words[i+1:]
		}
	}
	return "", nil
}

// commandsOf are the simple commands of every snippet that run name.
func commandsOf(all []snippet, name string) map[snippet][][]string {
	out := map[snippet][][]string{}
	for _, s := range all {
		for _, words := range simpleCommands(s.text) {
			if p, args := program(words); p == name {
				out[s] = append(out[s], args)
			}
		}
	}
	return out
}

// ---------------------------------------------------------------- binaries

// helpText is a command's --help, parsed: the flags it takes (each with
// whether it takes a value), and whether it has subcommands.
type helpText struct {
	usage   string          // the usage line's command path, e.g. "labcloud node stop"
	flags   map[string]bool // by name ("--output", "-o"): whether it takes a value
	own     [][]string      // the flags that are the command's own, not its parents': long name, short
	subs    []string        // the subcommands it lists
	hasSubs bool
}

// flagLine is a flag in pflag's help: "  -o, --output string   usage".
// A type word follows the name after one space; the usage after several.
var flagLine = regexp.MustCompile(`(?m)^\s+(?:-([a-zA-Z0-9]), )?--([a-zA-Z0-9][-a-zA-Z0-9._]*)( [^\s]+)?(?:\s|$)`)

func parseHelp(out string) helpText {
	h := helpText{flags: map[string]bool{}, hasSubs: strings.Contains(out, "\nAvailable Commands:")}
	if _, rest, ok := strings.Cut(out, "Usage:\n"); ok {
		line, _, _ := strings.Cut(strings.TrimSpace(rest), "\n")
		h.usage = strings.Join(strings.FieldsFunc(line, func(r rune) bool { return r == ' ' }), " ")
	}
	own, _, _ := strings.Cut(out, "\nGlobal Flags:")
	for _, m := range flagLine.FindAllStringSubmatch(out, -1) {
		takesValue := m[3] != ""
		h.flags["--"+m[2]] = takesValue
		if m[1] != "" {
			h.flags["-"+m[1]] = takesValue
		}
	}
	for _, m := range flagLine.FindAllStringSubmatch(own, -1) {
		if m[2] == "help" {
			continue
		}
		names := []string{"--" + m[2]}
		if m[1] != "" {
			names = append(names, "-"+m[1])
		}
		h.own = append(h.own, names)
	}
	if _, rest, ok := strings.Cut(out, "\nAvailable Commands:\n"); ok {
		for l := range strings.SplitSeq(rest, "\n") {
			if strings.TrimSpace(l) == "" {
				break
			}
			if name := strings.Fields(l)[0]; name != "help" {
				h.subs = append(h.subs, name)
			}
		}
	}
	return h
}

// binaries builds labcloud and the CCM as `make build` does.
func binaries(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("make", "-s", "build", "BIN="+dir)
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	return dir
}

// cli answers, from a binary's --help, what `NAME PATH...` is.
type cli struct {
	t    *testing.T
	name string
	bin  string
	seen map[string]*helpText
}

func newCLI(t *testing.T, dir, name string) *cli {
	return &cli{t: t, name: name, bin: filepath.Join(dir, name), seen: map[string]*helpText{}}
}

var commandName = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)

// of is the help of the command path, or nil when there is no such command.
func (c *cli) of(path []string) *helpText {
	if slices.ContainsFunc(path, func(w string) bool { return !commandName.MatchString(w) }) {
		return nil
	}
	key := strings.Join(path, " ")
	if h, ok := c.seen[key]; ok {
		return h
	}
	out, err := exec.Command(c.bin, append(slices.Clone(path), "--help")...).CombinedOutput()
	h := parseHelp(string(out))
	var found *helpText
	// cobra prints a parent's help for an unknown subcommand of it, so the
	// usage line must name the whole path.
	want := strings.Join(append([]string{c.name}, path...), " ")
	if err == nil && (h.usage == want || strings.HasPrefix(h.usage, want+" ")) {
		found = &h
	}
	c.seen[key] = found
	return found
}

// check walks a command line as cobra would: subcommands first, then
// flags (the command's and its parents' persistent ones) among the
// arguments, up to a lone "--". A word in brackets is an optional one; a
// word in capitals (NAME, DIR) stands for an argument.
func (c *cli) check(args []string) string {
	var path []string
	h := c.of(nil)
	if h == nil {
		c.t.Fatalf("%s --help fails", c.name)
	}
	positional := 0
	for i := 0; i < len(args); i++ {
		a := strings.TrimRight(strings.TrimLeft(args[i], "["), "]")
		switch {
		case a == "--":
			return ""
		case strings.HasPrefix(a, "-") && len(a) > 1:
			name, _, hasValue := strings.Cut(a, "=")
			takesValue, ok := h.flags[name]
			if !ok {
				return strings.Join(append([]string{c.name}, path...), " ") + " has no flag " + name
			}
			if takesValue && !hasValue {
				i++
			}
		case placeholder.MatchString(a):
			positional++
		case positional == 0 && (h.hasSubs || len(path) == 0):
			sub := c.of(append(slices.Clone(path), a))
			if sub == nil {
				return strings.Join(append([]string{c.name}, path...), " ") + " has no subcommand " + a
			}
			path, h = append(path, a), sub
		default:
			positional++
		}
	}
	return ""
}

// TestCommands checks the documents' commands against the binaries, as
// `make build` builds them.
func TestCommands(t *testing.T) {
	bin := binaries(t)
	t.Run("exist", func(t *testing.T) { checkCommandsExist(t, bin) })
	t.Run("lab.md's tables", func(t *testing.T) { checkLabCommandTables(t, bin) })
}

// checkCommandsExist: every labcloud and libvirt-cloud-controller-manager
// command line in the documents names subcommands and flags that the
// binaries have.
func checkCommandsExist(t *testing.T, bin string) {
	all := snippets(t)
	checked := 0
	for _, name := range []string{"labcloud", "libvirt-cloud-controller-manager"} {
		c := newCLI(t, bin, name)
		for s, cmds := range commandsOf(all, name) {
			for _, args := range cmds {
				checked++
				if msg := c.check(args); msg != "" {
					t.Errorf("%s: `%s %s`: %s", s, name, strings.Join(args, " "), msg)
				}
			}
		}
	}
	if checked < 50 {
		t.Errorf("only %d command lines found in the documents: is the extraction broken?", checked)
	}
}

// alternatives are the a|b|c of a synopsis ("node stop|start|delete NAME"):
// all but the first are dropped.
var alternatives = regexp.MustCompile(`\|[^\s\]]*`)

// checkLabCommandTables: lab.md's table of labcloud's commands and its
// table of up's flags show every command and every flag the binary has
// (cobra's own completion commands aside), and nothing it does not have.
func checkLabCommandTables(t *testing.T, bin string) {
	lab := readDoc(t, "docs/lab.md")
	c := newCLI(t, bin, "labcloud")
	documented := map[string]string{} // a command's path: its rows' synopses
	for _, tc := range []struct {
		section string
		command []string // what each row's first code span follows
	}{
		{"The `labcloud` command", nil},
		{"`up`'s flags", []string{"up"}},
	} {
		tbs := tables(section(t, lab, tc.section))
		if len(tbs) == 0 {
			t.Fatalf("docs/lab.md, %s: no table", tc.section)
		}
		rows := 0
		for _, tb := range tbs[:1] { // the section's own, not its subsections'
			for _, row := range tb.rows {
				synopsis, ok := firstSpanOK(row[0])
				if !ok {
					continue
				}
				rows++
				args := append(slices.Clone(tc.command), strings.Fields(alternatives.ReplaceAllString(synopsis, ""))...)
				if msg := c.check(args); msg != "" {
					t.Errorf("docs/lab.md, %s: `%s`: %s", tc.section, synopsis, msg)
					continue
				}
				documented[strings.Join(commandPath(c, args), " ")] += " " + synopsis
			}
		}
		if rows == 0 {
			t.Errorf("docs/lab.md, %s: no table rows found", tc.section)
		}
	}
	for path, synopses := range documented {
		if strings.HasPrefix(path, "completion") {
			continue
		}
		for _, f := range c.of(strings.Fields(path)).own {
			if !slices.ContainsFunc(f, func(name string) bool {
				return regexp.MustCompile(`(^|[\s\[])` + regexp.QuoteMeta(name) + `\b`).MatchString(synopses)
			}) {
				t.Errorf("docs/lab.md: labcloud %s's flag %s is in no row (rows: %s)", path, f[0], synopses)
			}
		}
	}
	for _, sub := range c.of(nil).subs {
		if !slices.ContainsFunc(slices.Collect(maps.Keys(documented)), func(p string) bool { return p == sub || strings.HasPrefix(p, sub+" ") }) {
			t.Errorf("docs/lab.md, The `labcloud` command: labcloud %s has no row", sub)
		}
	}
}

// commandPath is the subcommand path args name (their leading words that
// are subcommands).
func commandPath(c *cli, args []string) []string {
	var path []string
	for _, a := range args {
		if strings.HasPrefix(a, "-") || c.of(append(slices.Clone(path), a)) == nil {
			break
		}
		path = append(path, a)
	}
	return path
}
