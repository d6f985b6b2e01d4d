package imageload

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// A Store is an image store on the host that can save an image to a tar,
// as kind reads `docker save`.
type Store struct {
	Name string // as messages say it
	// Has says whether the store holds ref; why says what it answered.
	Has func(ctx context.Context, ref name.Reference) (ok bool, why string)
	// Save writes ref to file as a tar readArchive reads.
	Save func(ctx context.Context, ref name.Reference, file string) error
}

// HostStores are the host's stores, asked in order: Docker, Podman, then
// containerd's namespaces default and k8s.io. A store whose client is not
// installed is asked nothing.
func HostStores() []Store {
	out := []Store{cliStore("Docker", "docker"), cliStore("Podman", "podman")}
	for _, ns := range []string{"default", "k8s.io"} {
		out = append(out, containerdStore(ns))
	}
	return out
}

// cliStore is Docker's or Podman's store through its CLI (they share
// one), run as cli (a binary and its global flags).
func cliStore(display string, cli ...string) Store {
	return Store{
		Name: display,
		Has: func(ctx context.Context, ref name.Reference) (bool, string) {
			return run(ctx, cli, "image", "inspect", "--format", "{{.Id}}", ref.String())
		},
		Save: func(ctx context.Context, ref name.Reference, file string) error {
			_, err := output(ctx, cli, "save", "-o", file, ref.String())
			return err
		},
	}
}

// containerdStore is a containerd namespace through ctr (with global
// flags ctrFlags), which wants the full name containerd keeps
// (docker.io/library/app:ci).
func containerdStore(ns string, ctrFlags ...string) Store {
	ctr := append([]string{"ctr"}, ctrFlags...)
	ctr = append(ctr, "--namespace", ns)
	return Store{
		Name: "containerd (namespace " + ns + ")",
		Has: func(ctx context.Context, ref name.Reference) (bool, string) {
			out, err := output(ctx, ctr, "images", "list", "--quiet", "name=="+containerdName(ref))
			if err != nil {
				return false, err.Error()
			}
			if strings.TrimSpace(out) == "" {
				return false, "no such image"
			}
			return true, ""
		},
		Save: func(ctx context.Context, ref name.Reference, file string) error {
			_, err := output(ctx, ctr, "images", "export", "--platform", "linux/"+runtime.GOARCH, file, containerdName(ref))
			return err
		},
	}
}

// containerdName is ref as containerd names it: Docker Hub is docker.io.
func containerdName(ref name.Reference) string {
	if r, ok := strings.CutPrefix(ref.Name(), name.DefaultRegistry+"/"); ok {
		return "docker.io/" + r
	}
	return ref.Name()
}

// run says whether cli args succeeds, and else why, briefly.
func run(ctx context.Context, cli []string, args ...string) (bool, string) {
	if _, err := output(ctx, cli, args...); err != nil {
		return false, err.Error()
	}
	return true, ""
}

// output runs cli args and returns its standard output; its error quotes
// the last line of its standard error, or says the client is missing.
func output(ctx context.Context, cli []string, args ...string) (string, error) {
	if _, err := exec.LookPath(cli[0]); err != nil {
		return "", fmt.Errorf("%s is not installed", cli[0])
	}
	var stderr strings.Builder
	cmd := exec.CommandContext(ctx, cli[0], append(cli[1:len(cli):len(cli)], args...)...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		return "", fmt.Errorf("%s %s: %w: %s", cli[0], args[0], err, lines[len(lines)-1])
	}
	return string(out), nil
}

// fromStores saves each named image from the first store that has it into
// tmp and reads it back under the name it was asked by.
func fromStores(ctx context.Context, stores []Store, refs []string, tmp string) ([]Image, error) {
	var out []Image
	for i, s := range refs {
		ref, err := name.NewTag(s)
		if err != nil {
			return nil, fmt.Errorf("image %q is not a reference NAME[:TAG]: %w", s, err)
		}
		var asked []string
		found := false
		for _, st := range stores {
			ok, why := st.Has(ctx, ref)
			if !ok {
				asked = append(asked, fmt.Sprintf("%s: %s", st.Name, why))
				continue
			}
			file := filepath.Join(tmp, fmt.Sprintf("image-%d.tar", i))
			if err := st.Save(ctx, ref, file); err != nil {
				return nil, fmt.Errorf("image %s from %s: %w", s, st.Name, err)
			}
			imgs, err := readArchive(file, tmp)
			if err != nil {
				return nil, fmt.Errorf("image %s from %s: %w", s, st.Name, err)
			}
			// The saved tar holds the image under the store's spelling of
			// the name; it is loaded under the name asked for.
			out = append(out, Image{Name: ref, Image: imgs[0].Image, From: st.Name})
			found = true
			break
		}
		if !found {
			return nil, fmt.Errorf("image %s is in no store on this host; asked %s", s, strings.Join(asked, "; "))
		}
	}
	return out, nil
}
