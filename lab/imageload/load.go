package imageload

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/labcloud/labcloud/lab/registry"
)

// Options say what to load and where.
type Options struct {
	Archives []string // docker-archive or OCI layout tars
	Images   []string // names in the host's stores
	Stores   []Store  // HostStores() when nil
	// Registry is the lab registry's push address (host:port, plain HTTP)
	// and Transport the way to it.
	Registry  string
	Transport http.RoundTripper
	Out       io.Writer
	// ProgressEvery is the least time between two progress lines of an
	// image (a second when zero).
	ProgressEvery time.Duration
}

// Load reads every image of every input and validates each (every blob
// hashed) before it pushes any: a missing image, a corrupt tar or a name
// that is not a reference fails the whole load, naming the input, with
// nothing loaded. Each image goes to the registry under its own name,
// blobs first and its manifest last, so a pull never sees half of one.
func Load(ctx context.Context, opts Options) error {
	tmp, err := os.MkdirTemp("", "labcloud-load-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	imgs, err := read(ctx, opts, tmp)
	if err != nil {
		return err
	}
	for _, im := range imgs {
		fmt.Fprintf(opts.Out, "%s: pushing %s\n", im.Name, im.From)
		if err := push(ctx, opts, im); err != nil {
			return fmt.Errorf("%s (%s): %w", im.Name, im.From, err)
		}
	}
	return nil
}

// read reads and validates every input.
func read(ctx context.Context, opts Options, tmp string) ([]Image, error) {
	var imgs []Image
	for _, f := range opts.Archives {
		got, err := readArchive(f, tmp)
		if err != nil {
			return nil, err
		}
		imgs = append(imgs, got...)
	}
	stores := opts.Stores
	if stores == nil {
		stores = HostStores()
	}
	got, err := fromStores(ctx, stores, opts.Images, tmp)
	if err != nil {
		return nil, err
	}
	imgs = append(imgs, got...)
	from := map[string]string{}
	for _, im := range imgs {
		if prev, ok := from[im.Name.Name()]; ok {
			return nil, fmt.Errorf("%s is given twice (%s and %s)", im.Name, prev, im.From)
		}
		from[im.Name.Name()] = im.From
		if err := validate.Image(im.Image); err != nil {
			return nil, fmt.Errorf("%s: image %s is corrupt: %w", im.From, im.Name, err)
		}
	}
	return imgs, nil
}

// Target is where the registry at addr keeps the image named t.
func Target(addr string, t name.Tag) (name.Tag, error) {
	return name.NewTag(addr+"/"+registry.Namespace(t.RegistryStr())+"/"+t.RepositoryStr()+":"+t.TagStr(), name.Insecure)
}

// push writes im to the registry, saying so when it is there already, with
// a progress line at most every ProgressEvery.
func push(ctx context.Context, opts Options, im Image) error {
	to, err := Target(opts.Registry, im.Name)
	if err != nil {
		return err
	}
	ropts := []remote.Option{remote.WithContext(ctx), remote.WithTransport(opts.Transport)}
	digest, err := im.Image.Digest()
	if err != nil {
		return err
	}
	size, err := imageSize(im.Image)
	if err != nil {
		return err
	}
	if d, err := remote.Head(to, ropts...); err == nil && d.Digest == digest {
		fmt.Fprintf(opts.Out, "%s: already loaded (%s, %s)\n", im.Name, digest, mb(size))
		return nil
	}
	every := opts.ProgressEvery
	if every == 0 {
		every = time.Second
	}
	updates := make(chan v1.Update, 64)
	done := make(chan error, 1)
	go func() { done <- remote.Write(to, im.Image, append(ropts, remote.WithProgress(updates))...) }()
	last := time.Now()
	for u := range updates {
		if u.Error == nil && time.Since(last) >= every {
			fmt.Fprintf(opts.Out, "%s: %s of %s\n", im.Name, mb(u.Complete), mb(u.Total))
			last = time.Now()
		}
	}
	if err := <-done; err != nil {
		return err
	}
	fmt.Fprintf(opts.Out, "%s: loaded (%s, %s); every node pulls it from the lab's registry\n", im.Name, digest, mb(size))
	return nil
}

// imageSize is what the registry stores of img: its manifest, config and
// layers as pushed.
func imageSize(img v1.Image) (int64, error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, err
	}
	raw, err := img.RawManifest()
	if err != nil {
		return 0, err
	}
	n := int64(len(raw)) + m.Config.Size
	for _, l := range m.Layers {
		n += l.Size
	}
	return n, nil
}

func mb(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }
