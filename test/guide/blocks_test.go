package guide

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// step is one thing the guide has the reader do, in order: a shell block
// to run (on the KVM host, or on the build machine), or a point where the
// reader does something the page only describes (creating the guests),
// which the test does its own way.
type step struct {
	line   int
	where  string // "host" or "build" for a block; "" for a hook
	hook   string // the marker's first word, for a hook
	script string
}

// marker is an HTML comment the page renders as nothing: <!-- guide: WORD ... -->.
var marker = regexp.MustCompile(`^<!-- guide: (\S+)[^>]*-->$`)

// guideSteps reads the page's steps: every ```sh block, and the markers.
// A "build" marker says the next block runs on the build machine; any
// other marker is a hook. Blocks of other languages are text to read.
func guideSteps(path string) ([]step, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		steps     []step
		where     = "host"
		inBlock   bool
		runnable  bool
		body      strings.Builder
		blockLine int
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case inBlock && strings.TrimSpace(line) == "```":
			if runnable {
				steps = append(steps, step{line: blockLine, where: where, script: body.String()})
				where = "host"
			}
			inBlock = false
		case inBlock:
			body.WriteString(line + "\n")
		case strings.HasPrefix(line, "```"):
			inBlock, blockLine = true, n
			runnable = strings.TrimSpace(strings.TrimPrefix(line, "```")) == "sh"
			body.Reset()
		case marker.MatchString(line):
			word := marker.FindStringSubmatch(line)[1]
			if word == "build" {
				where = "build"
				continue
			}
			steps = append(steps, step{line: n, hook: word})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if inBlock {
		return nil, fmt.Errorf("%s: the block at line %d never ends", path, blockLine)
	}
	return steps, nil
}

func guidePath() string { return filepath.Join("..", "..", "docs", "install-kubeadm.md") }

// The page's steps are what the guide's test runs: the guests are made
// after the network's block and before the first block that reaches them,
// one block runs on the build machine (make deb) before the package is
// installed, and every other block runs on the host. Runs without a lab,
// so that a change to the page that the guide's test would trip on fails
// here first.
func TestGuideSteps(t *testing.T) {
	steps, err := guideSteps(guidePath())
	if err != nil {
		t.Fatal(err)
	}
	index := func(pred func(step) bool) int {
		for i, s := range steps {
			if pred(s) {
				return i
			}
		}
		return -1
	}
	guests := index(func(s step) bool { return s.hook == "guests" })
	network := index(func(s step) bool { return strings.Contains(s.script, "virsh net-update default add ip-dhcp-host") })
	ssh := index(func(s step) bool { return strings.Contains(s.script, "ssh root@") })
	build := index(func(s step) bool { return s.where == "build" })
	install := index(func(s step) bool { return strings.Contains(s.script, "apt install ./dist/") })
	switch {
	case guests < 0 || network < 0 || ssh < 0:
		t.Fatalf("want the network's block, the guests marker and a block using ssh; steps: %+v", steps)
	case !(network < guests && guests < ssh):
		t.Errorf("the guests are made at step %d: want it after the network's block (%d) and before the first ssh (%d)", guests, network, ssh)
	case build < 0 || !strings.Contains(steps[build].script, "make deb") || install < build:
		t.Errorf("want `make deb` on the build machine before `apt install ./dist/...` on the host: build %d, install %d", build, install)
	}
	for _, s := range steps {
		if s.hook != "" && s.hook != "guests" {
			t.Errorf("line %d: marker %q: the test knows only guests and build", s.line, s.hook)
		}
		if s.where == "build" && strings.Contains(s.script, "ssh ") {
			t.Errorf("line %d: a build-machine block reaches a guest", s.line)
		}
	}
}
