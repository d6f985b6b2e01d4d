package lab

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// A lab that crashed before it saved its state still leaves its other
// hosts' namespaces and libvirtds to down: without a state, down covers
// every host up could have made.
func TestDownWithoutStateCoversEveryHost(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "lab")
	st := stateOrGuess(dir)
	if len(st.LabHosts()) != MaxHosts || st.Pids == nil {
		t.Fatalf("without a state: %d hosts, pids %v; want all %d hosts", len(st.LabHosts()), st.Pids, MaxHosts)
	}
	for k, h := range st.LabHosts()[1:] {
		if want := fmt.Sprintf("%s-host%d", Netns, k+2); h.Netns != want || h.private(dir).Root == "" {
			t.Errorf("host %d: namespace %q, libvirtd root %q; want %s", k+2, h.Netns, h.private(dir).Root, want)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	saved := &State{Dir: dir, Pids: map[string]int{"etcd": 1}}
	if err := saved.Save(); err != nil {
		t.Fatal(err)
	}
	if st := stateOrGuess(dir); len(st.LabHosts()) != 1 || st.Pids["etcd"] != 1 {
		t.Errorf("with a state: %d hosts, pids %v; want the saved one", len(st.LabHosts()), st.Pids)
	}
}
