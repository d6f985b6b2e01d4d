// Package registry serves the lab's loaded images to its nodes: one OCI
// registry (go-containerregistry's pkg/registry, blobs on disk) that every
// node's containerd uses as a mirror for every name, so an image loaded
// once runs on every node, including nodes started or restarted later.
//
// Images are stored under the name of the registry they are known by:
// example.invalid/acc/app:ci is the repository example.invalid/acc/app
// here, app:ci is docker.io/library/app. A mirror request from containerd
// names that registry in ?ns= (containerd's namespaceQueryArg), which this
// package moves into the path, so two registries' same repository never
// collide.
//
// ggcr keeps manifests in memory only: every manifest PUT that succeeds is
// also written to dir/manifests (temp file and rename) and replayed at
// start, so a restarted registry loses nothing.
package registry

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	ggcr "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// maxManifest bounds a manifest PUT's body, as the OCI distribution spec
// lets registries (4 MiB); a manifest is a few KiB.
const maxManifest = 4 << 20

// Registry is the lab's registry over a directory.
type Registry struct {
	h       http.Handler // ggcr's
	records string       // dir/manifests
	mu      sync.Mutex   // orders manifest PUTs with their records
}

// record is one manifest PUT that succeeded, as replayed at start.
type record struct {
	Repo      string `json:"repo"`
	Reference string `json:"reference"` // a tag or a digest
	MediaType string `json:"mediaType"`
	Manifest  []byte `json:"manifest"`
}

// Open serves the images stored in dir (blobs under dir/blobs, manifests
// recorded under dir/manifests), replaying the recorded manifests. ggcr
// logs each request to logw.
func Open(dir string, logw io.Writer) (*Registry, error) {
	blobs, records := filepath.Join(dir, "blobs"), filepath.Join(dir, "manifests")
	for _, d := range []string{blobs, records} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	r := &Registry{
		h:       ggcr.New(ggcr.WithBlobHandler(ggcr.NewDiskBlobHandler(blobs)), ggcr.Logger(log.New(logw, "", log.LstdFlags))),
		records: records,
	}
	return r, r.replay()
}

// ReadWrite serves pulls and pushes: for labcloud load only (the lab's
// loopback).
func (r *Registry) ReadWrite() http.Handler { return http.HandlerFunc(r.serve) }

// ReadOnly serves pulls only: for the nodes, which have no reason to push
// and must not replace what the user loaded.
func (r *Registry) ReadOnly() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			writeError(w, http.StatusMethodNotAllowed, "DENIED", "this address of the lab's registry is read-only; labcloud load pushes")
			return
		}
		r.serve(w, req)
	})
}

func (r *Registry) serve(w http.ResponseWriter, req *http.Request) {
	if err := unmirror(req); err != nil {
		writeError(w, http.StatusBadRequest, "NAME_INVALID", err.Error())
		return
	}
	repo, ref, ok := manifestPath(req.URL.Path)
	switch {
	case req.Method == http.MethodDelete:
		// Nothing deletes, and a delete would need its record removed.
		writeError(w, http.StatusMethodNotAllowed, "UNSUPPORTED", "the lab's registry keeps what was loaded until labcloud down")
	case ok && req.Method == http.MethodPut:
		r.putManifest(w, req, repo, ref)
	default:
		r.h.ServeHTTP(w, req)
	}
}

// putManifest has ggcr store the manifest and records it before answering,
// so a 201 means it survives a restart.
func (r *Registry) putManifest(w http.ResponseWriter, req *http.Request, repo, ref string) {
	body, err := io.ReadAll(io.LimitReader(req.Body, maxManifest+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, "MANIFEST_INVALID", err.Error())
		return
	}
	if len(body) > maxManifest {
		writeError(w, http.StatusRequestEntityTooLarge, "SIZE_INVALID", fmt.Sprintf("manifest larger than %d bytes", maxManifest))
		return
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := httptest.NewRecorder()
	r.h.ServeHTTP(rec, req)
	if rec.Code == http.StatusCreated {
		// ggcr keeps a manifest put by tag under its digest too: so do
		// the records, or a retag would lose the old digest a pod runs.
		refs := []string{ref}
		if d := rec.Header().Get("Docker-Content-Digest"); d != "" && d != ref {
			refs = append(refs, d)
		}
		for _, ref := range refs {
			if err := r.write(record{Repo: repo, Reference: ref, MediaType: req.Header.Get("Content-Type"), Manifest: body}); err != nil {
				writeError(w, http.StatusInternalServerError, "INTERNAL_SERVER_ERROR", fmt.Sprintf("record the manifest: %v", err))
				return
			}
		}
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

// write records rec atomically; a later PUT of the same repository and
// reference replaces it, as in ggcr's memory.
func (r *Registry) write(rec record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	key := sha256.Sum256([]byte(rec.Repo + "\x00" + rec.Reference))
	f, err := os.CreateTemp(r.records, ".tmp-*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(r.records, hex.EncodeToString(key[:])+".json"))
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}

// replay puts every recorded manifest into ggcr's memory: images before
// indexes (ggcr refuses an index whose images it lacks), each kind in the
// order they were pushed.
func (r *Registry) replay() error {
	paths, err := filepath.Glob(filepath.Join(r.records, "*.json"))
	if err != nil {
		return err
	}
	type loaded struct {
		record
		index bool
		at    time.Time
	}
	var recs []loaded
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		var rec record
		if err := json.Unmarshal(b, &rec); err != nil {
			return fmt.Errorf("manifest record %s: %w", p, err)
		}
		recs = append(recs, loaded{rec, types.MediaType(rec.MediaType).IsIndex(), fi.ModTime()})
	}
	slices.SortStableFunc(recs, func(a, b loaded) int {
		if a.index != b.index {
			if a.index {
				return 1
			}
			return -1
		}
		return a.at.Compare(b.at)
	})
	for _, rec := range recs {
		req := httptest.NewRequest(http.MethodPut, "/v2/"+rec.Repo+"/manifests/"+rec.Reference, bytes.NewReader(rec.Manifest))
		req.Header.Set("Content-Type", rec.MediaType)
		w := httptest.NewRecorder()
		r.h.ServeHTTP(w, req)
		if w.Code != http.StatusCreated {
			return fmt.Errorf("replay the manifest of %s:%s: %d %s", rec.Repo, rec.Reference, w.Code, strings.TrimSpace(w.Body.String()))
		}
	}
	return nil
}

// manifestPath splits /v2/REPO/manifests/REF.
func manifestPath(p string) (repo, ref string, ok bool) {
	rest, ok := strings.CutPrefix(p, "/v2/")
	if !ok {
		return "", "", false
	}
	i := strings.LastIndex(rest, "/manifests/")
	if i <= 0 {
		return "", "", false
	}
	repo, ref = rest[:i], rest[i+len("/manifests/"):]
	return repo, ref, ref != "" && !strings.Contains(ref, "/")
}

// unmirror moves a mirror request's ?ns=HOST into its path:
// /v2/REPO/...?ns=HOST is /v2/Namespace(HOST)/REPO/....
func unmirror(req *http.Request) error {
	q := req.URL.Query()
	ns := q.Get("ns")
	if ns == "" {
		return nil
	}
	rest, ok := strings.CutPrefix(req.URL.Path, "/v2/")
	if !ok || rest == "" {
		return nil // the API version check
	}
	if !validHost(ns) {
		return fmt.Errorf("ns=%.80q is not a registry host", ns)
	}
	q.Del("ns")
	req.URL.RawQuery = q.Encode()
	req.URL.Path = "/v2/" + Namespace(ns) + "/" + rest
	req.URL.RawPath = ""
	return nil
}

// validHost says s could be a registry host[:port] as a reference names it.
func validHost(s string) bool {
	if len(s) > 255 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune(".-:[]", c)) {
			return false
		}
	}
	return true
}

// Namespace is the path under which the images of registry host live
// here: the host in lower case, Docker Hub as containerd names it
// (docker.io, where go-containerregistry says index.docker.io), and a
// port's colon (invalid in a repository) as '_' (invalid in a host name,
// so no two hosts meet).
func Namespace(host string) string {
	host = strings.ToLower(host)
	if host == "index.docker.io" || host == "registry-1.docker.io" {
		host = "docker.io"
	}
	return strings.NewReplacer("[", "", "]", "", ":", "_").Replace(host)
}

// writeError answers in the distribution spec's error format, which
// clients show.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string][]map[string]string{"errors": {{"code": code, "message": msg}}})
}

// HostsTOML is containerd's certs.d/_default/hosts.toml that sends every
// pull to the registry at addr (host:port, plain HTTP) first. With no
// `server`, containerd appends each name's own registry after it
// (containerd v2 core/remotes/docker/config ConfigureHosts), and a 404 or a
// refused connection from the mirror moves on to that one: an image nobody
// loaded is pulled as before. Pull and resolve only: nodes never push.
func HostsTOML(addr string) []byte {
	return fmt.Appendf(nil, "# The lab's registry (labcloud load), then each name's own registry.\n%s", mirrorTOML(addr))
}

// PlainHTTPHostsTOML is containerd's certs.d/HOST:PORT/hosts.toml for a
// registry that speaks plain HTTP: the lab's registry at addr first, as
// for every name, then the registry itself over HTTP.
func PlainHTTPHostsTOML(addr, registry string) []byte {
	return fmt.Appendf(nil, "# The lab's registry (labcloud load), then %s over plain HTTP.\nserver = %q\n%s", registry, "http://"+registry, mirrorTOML(addr))
}

func mirrorTOML(addr string) string {
	return fmt.Sprintf("[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://"+addr)
}

// Serve serves the registry in dir on each readOnly address (the nodes')
// and each readWrite one (labcloud load's) until ctx ends.
func Serve(ctx context.Context, dir string, readOnly, readWrite []string, logw io.Writer) error {
	r, err := Open(dir, logw)
	if err != nil {
		return err
	}
	var servers []*http.Server
	errs := make(chan error, len(readOnly)+len(readWrite))
	listen := func(addr string, h http.Handler) error {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		s := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, s)
		go func() { errs <- fmt.Errorf("%s: %w", addr, s.Serve(l)) }()
		return nil
	}
	defer func() {
		for _, s := range servers {
			_ = s.Close()
		}
	}()
	for _, a := range readOnly {
		if err := listen(a, r.ReadOnly()); err != nil {
			return err
		}
	}
	for _, a := range readWrite {
		if err := listen(a, r.ReadWrite()); err != nil {
			return err
		}
	}
	fmt.Fprintf(logw, "serving %s: read-only on %v, read-write on %v\n", dir, readOnly, readWrite)
	select {
	case <-ctx.Done():
		return nil
	case err := <-errs:
		return err
	}
}
